"""The op table: every op of the Term language, declared once.

An op has tensor operands (``arity``), attributes typed by egglog primitive sorts, and one torch
implementation. The same implementation runs the optimized program and, on float64 tensors, is the
reference evaluator; composite ops (softmax, attention, ...) are checked in the tests against their
definitions in primitive ops. The egglog datatype is generated from this table.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import operator
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from . import mesh

ATTR_SORTS = {"i64": int, "f64": float, "String": str, "bool": bool}


UNBOUNDED = (-math.inf, math.inf)
#: curvature of an op that is linear (or piecewise linear) in each operand: (sup |f''|, sup |f'|)
LINEAR = (0.0, 1.0)


@dataclass(frozen=True)
class Op:
    """One op and every fact the stages derive from; a fact left None is undeclared (a test
    fails on a non-leaf op with one). Kinds are dispatched on by the stage named."""
    name: str
    arity: int
    attrs: tuple[tuple[str, str], ...]  # (name, egglog sort)
    impl: Callable | None  # torch implementation impl(*operands, *attrs); None for leaves
    infix: str | None = None
    shape: str | None = None  # shape inference kind (lang/term.py); "meta" runs impl on meta tensors
    range: str | Callable | None = None  # range transfer kind (analysis/ranges.py), or an increasing
    # float function: the interval's image
    bounds: tuple[float, float] | None = None  # every value it can take (UNBOUNDED: no such bound)
    sign: str | None = None  # "positive", "nonneg" or "any": an e-graph fact (egraph/range_rules.py)
    curvature: tuple[float, float] | str | None = None  # (sup |f''|, sup |f'|), or a formula kind
    # over operand ranges (extractors/curvature.py)
    growth: int | None = None  # class of kappa over unbounded ranges: 0 linear .. 3 exponential
    error: str | None = None  # how it amplifies its operands' rounding error (curvature.py):
    # "exp" by |x|, "log" by 1/|log u|, "cancels" (a +- b), "sum" (of both signs), "shifted-exp"
    # (exp(x - max(x)) inside), "log-sum-exp" (and the log of its sum, near 1 where one term
    # dominates: logaddexp is not one, it adds log1p(exp(-|a - b|))), "rotation" (x cos +
    # rotate_half(x) sin: a sum of two rounded products, as cancels), "none"
    rounding: str | None = None  # "exact" from exact operands, "rounds", or "widening" (a cast)
    passes: int | None = None  # passes over memory, when the profiling database has no estimate
    precision: str | None = None  # in half precision: "accumulate" (many terms: do it in float32),
    # "hoist" (compute before rounding), "keep" (rulesets/precision.py)
    sample: tuple = ()  # operand shapes ("x0", ...) and attributes the precision rules' proofs sample
    work: str | None = None  # profiling kind (profiling/profiler.py); "static": priced by passes
    flops: float | None = None  # FLOPs per element, for the per-element work kinds
    onnx: str | None = None  # ONNX form: an operator type, or a decomposition (backends/onnx_emitters.py)
    numpy: str | None = None  # the numpy function of a numpy kernel (kernels/registry.py), if any
    definition: str | None = None  # in primitive ops, a pattern over ?x0.. and its attributes: the
    # ONNX form "definition" writes it
    layout: str | None = None  # the memory layout of its result (analysis/layouts.py): "fresh"
    # (always contiguous), "view" (strides follow from the operand's), "runs" (contiguous from
    # contiguous operands, else as its kernel chooses: found by running it)
    mesh: str | None = None  # an op over a mesh (lang/mesh.py) that sees every device's part:
    # "parts" (each device then holds its own part) or "whole" (each holds the same whole value);
    # None: an op that runs once per device on its own part

    @property
    def egg_name(self) -> str:
        """CamelCase constructor name, clear of egglog's own primitives (max, exp on f64...)."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @property
    def is_leaf(self) -> bool:
        return self.arity == 0


def shape_attr(shape) -> str:
    """Shapes and permutations travel as egglog Strings: ``(2, 3)`` -> ``"2,3"``."""
    return ",".join(str(int(d)) for d in shape)


@functools.lru_cache(maxsize=4096)
def parse_shape(text: str) -> tuple[int, ...]:
    """Cached: a reshape, expand or permute kernel parses its attribute on every call (2 us)."""
    return tuple(int(d) for d in text.split(",")) if text else ()


#: set by tests: guards take the device path on CPU too, as on CUDA (``device_path``)
_FORCED_DEVICE_PATH = contextvars.ContextVar("forced_device_path", default=False)


def device_path(x: torch.Tensor) -> bool:
    """Whether a guard on ``x``'s values stays on its device (computed there and selected with
    ``torch.where``, never read on the host): on CUDA a read (``float()``, ``bool()``, ``.item()``)
    stalls the stream, and four cost more than an attention; on CPU a read costs nothing and a
    check that skips a pass is cheaper. Tests take it on CPU with ``forcing_device_path``."""
    return x.device.type != "cpu" or _FORCED_DEVICE_PATH.get()


@contextlib.contextmanager
def forcing_device_path():
    """Guards take the device path on CPU tensors too (tests: no host reads while a plan runs)."""
    token = _FORCED_DEVICE_PATH.set(True)
    try:
        yield
    finally:
        _FORCED_DEVICE_PATH.reset(token)


def _tensor(x, like):
    return x if isinstance(x, torch.Tensor) else torch.full((), x, dtype=like.dtype, device=like.device)


def maximum(a, b):
    return torch.maximum(_tensor(a, b), _tensor(b, a))


def minimum(a, b):
    return torch.minimum(_tensor(a, b), _tensor(b, a))


def where(cond, a, b):
    return torch.where(cond, a, b)


def reduce_sum(x, axis, keepdim):
    return torch.sum(x, dim=axis, keepdim=keepdim)


def compensated_sum(x, axis, keepdim):
    """Sum that carries the rounding error of every addition (Knuth's TwoSum, added pairwise) and
    adds it back at the end: as accurate as a sum in twice the working precision, so exact values
    that cancel (1e8 + 1 - 1e8) keep their small terms where a plain float32 sum drops them."""
    v = x.movedim(axis, -1)
    if not v.is_floating_point() or v.dim() == 0 or v.shape[-1] == 0:  # a 0-d x: itself
        return torch.sum(x, dim=axis, keepdim=keepdim)
    error = torch.zeros_like(v)
    while v.shape[-1] > 1:
        if v.shape[-1] % 2:
            v, error = (torch.cat([t, torch.zeros_like(t[..., :1])], -1) for t in (v, error))
        a, b = v[..., 0::2], v[..., 1::2]
        v = a + b
        b_part = v - a
        step = (a - (v - b_part)) + (b - b_part)  # NaN where a + b overflowed or met an inf
        error = error[..., 0::2] + error[..., 1::2] + torch.where(v.isfinite(), step, 0.0)
    out = v[..., 0] + error[..., 0]
    return out.unsqueeze(axis) if keepdim else out


def reduce_mean(x, axis, keepdim):
    return torch.mean(x, dim=axis, keepdim=keepdim)


def reduce_max(x, axis, keepdim):
    return torch.amax(x, dim=axis, keepdim=keepdim)


def var(x, axis, keepdim, correction):
    return torch.var(x, dim=axis, keepdim=keepdim, correction=correction)


def gelu(x, approximate):
    """x * Phi(x), repaired where torch's kernel for this device and dtype is off (asked once,
    ``_gelu_repairs``): some (AVX2 CPUs') return +0 at -0 and where Phi(x) underflows, so the
    sign of x is put back; some (the erf form on AVX-512 CPUs) compute x (1 + erf) first, NaN at
    +inf and +inf above max / 2, so where the output's maximum is not finite, x > 8 (Phi(x) = 1
    in every dtype) is x."""
    out = F.gelu(x, approximate=approximate)
    if x.device.type == "meta" or not out.numel():
        return out
    sign, top = _gelu_repairs(x.device.type, x.dtype, approximate)
    if sign:
        out.copysign_(x)  # in place: its own output
    if top and (device_path(x) or not math.isfinite(out.amax().item())):  # NaN too; .item(): 9 us
        # less than a 0-d isfinite. x > 8 is x in every dtype: the where changes no right value
        out = torch.where(x > 8, x, out)
    return out


@functools.cache
def _gelu_repairs(device: str, dtype: torch.dtype, approximate: str) -> tuple[bool, bool]:
    """Whether torch's gelu kernel for this device and dtype loses the sign of x where the result
    is 0, and whether it gets +inf or the dtype's max wrong; on vectors that take the vectorized
    path and its scalar tail."""
    big = torch.finfo(dtype).max
    negative = torch.tensor([-0.0, -100.0, -big] * 33, dtype=dtype, device=device)
    top = torch.tensor([math.inf, big] * 33, dtype=dtype, device=device)
    sign_lost = not bool(F.gelu(negative, approximate=approximate).signbit().all())
    return sign_lost, not torch.equal(F.gelu(top, approximate=approximate), top)


def fmod(a, b):
    return torch.fmod(_tensor(a, b), _tensor(b, a))  # the sign of a, as C's fmod


def remainder(a, b):
    return torch.remainder(_tensor(a, b), _tensor(b, a))  # the sign of b, as Python's %


def atan2(y, x):
    return torch.atan2(_tensor(y, x), _tensor(x, y))


def hypot(a, b):
    """sqrt(a^2 + b^2) without overflow or underflow; NaN where an operand is NaN, as the
    definition is (IEEE's hypot(inf, NaN) is inf)."""
    a, b = _tensor(a, b), _tensor(b, a)
    return torch.where(a.isnan() | b.isnan(), a + b, torch.hypot(a, b))


def cbrt(x):
    """The real cube root (torch has none: x ** (1/3) is NaN for x < 0), computed in float64 and
    rounded; a float64 operand gets one Newton step (x / y^2 cannot overflow where y^3 would)."""
    wide = x.double()
    y = wide.abs().pow(1 / 3).copysign(wide)
    if x.dtype == torch.float64:
        y = torch.where((y != 0) & y.isfinite(), y - (y - wide / (y * y)) / 3, y)
    return y.to(x.dtype)


def cube_root(v: float) -> float:
    """cbrt on a float (the increasing function cbrt's range is the image of)."""
    return math.copysign(abs(v) ** (1 / 3), v)


def permute(x, perm):
    return x.permute(*parse_shape(perm))


def reshape(x, shape):
    return x.reshape(parse_shape(shape))


def expand(x, shape):
    return x.expand(parse_shape(shape))


def slice_(x, axis, start, end, step):
    return x[(slice(None),) * (x.dim() + axis) + (slice(start, end, step),)]


def concat(a, b, axis):
    return torch.cat([a, b], dim=axis)


def gather(x, index, axis):
    return torch.gather(x, axis, index)


def index_select(x, index, axis):
    return torch.index_select(x, axis, index)


def _naive_at_posinf(x, axis, out, elsewhere: float):
    """Where a row holds +inf (and no NaN), what the naive quotient gives: NaN at each +inf and
    ``elsewhere`` (0 for softmax, -inf for its log) off it, where the max-shifted form alone is NaN
    across the row. So fusing the naive form is exact at +inf too (one ``where``, no extra pass)."""
    if not x.is_floating_point() or not x.numel():
        return out
    top = torch.amax(x, dim=axis, keepdim=True)  # NaN in a row with a NaN: the row stays NaN
    if not device_path(x) and not bool((top == torch.inf).any()):  # the usual case: no more
        return out  # passes (on a GPU the check would stall the stream: the where runs instead)
    naive = torch.where(x == torch.inf, torch.nan, elsewhere).to(out.dtype)
    return torch.where(top == torch.inf, naive, out)


def softmax(x, axis):
    """exp(x) / sum(exp(x)), max-shifted ([inf, 1, 2] -> [nan, 0, 0], as the naive quotient)."""
    return _naive_at_posinf(x, axis, torch.softmax(x, axis), 0.0)


def log_softmax(x, axis):
    """log(softmax(x)), max-shifted ([inf, 1, 2] -> [nan, -inf, -inf], as the naive form)."""
    return _naive_at_posinf(x, axis, torch.log_softmax(x, axis), -torch.inf)


def cast(x, dtype):
    return x.to(getattr(torch, dtype))


def logsumexp(x, axis, keepdim):
    return torch.logsumexp(x, dim=axis, keepdim=keepdim)


def _normalized(x, weight, bias, eps):
    """F.layer_norm over the last axis. In float32 a row whose variance overflows (|x| beyond
    ~sqrt(max / n)) gives 0 or NaN where the normalized row is finite: torch's kernel returns each
    row's 1/std with it, 0 or NaN exactly there, so one pass over the rows (not over x) finds them,
    and they are recomputed in float64. Narrower dtypes accumulate in float32, which cannot
    overflow on their values."""
    out, _, rstd = torch.native_layer_norm(x, x.shape[-1:], weight, bias, eps)
    if x.device.type == "meta" or x.dtype != torch.float32 or not x.numel():
        return out
    if not device_path(x):  # on the device, the where below runs on every call
        low, high = (float(r) for r in torch.aminmax(rstd))
        if 0 < low and high < math.inf:  # False where one is NaN
            return out
    wrong = ~((rstd > 0) & rstd.isfinite())  # a row holding inf or NaN too: float64 gives NaN there
    wide = [None if t is None else t.double() for t in (weight, bias)]
    return torch.where(wrong, F.layer_norm(x.double(), x.shape[-1:], *wide, eps).to(out.dtype), out)


def layer_norm(x, weight, bias, eps):
    """Over the last axis; an affine-free spelling carries scalar consts as weight and bias."""
    if not isinstance(weight, float) and not isinstance(bias, float):  # tensors (or None)
        return _normalized(x, weight, bias, eps)
    return _normalized(x, None, None, eps) * weight + bias


@functools.lru_cache(maxsize=64)
def _scalar(value: float, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as a 0-dim CPU tensor, which any device's op takes: an in-place op with it costs
    1.4 us, with a Python number (wrapped in a new tensor on each call) 3.6 us. Never written to."""
    with torch.inference_mode(False):  # usable outside inference mode too
        return torch.tensor(value, dtype=dtype)


def rms_norm(x, weight, eps):
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis (an affine-free spelling carries the
    scalar const 1.0 as weight), in the dtype of that product (shape kind "broadcast"). The mean of
    squares is a vector_norm accumulated in float32 at least: one pass and no x^2 tensor;
    squaring the norm overflows exactly where x^2's sum does. Where autograd keeps none of its
    temporaries, it computes the same values in place on them, its constants 0-dim tensors: at
    (2, 256, 64) the per-row chain of small ops cost more than the passes over x."""
    wide = torch.promote_types(x.dtype, torch.float32)
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=wide)
    scalar = isinstance(weight, float)
    if torch.is_grad_enabled() and (x.requires_grad or not scalar and weight.requires_grad):
        out = x * torch.rsqrt(norm.square() / max(x.shape[-1], 1) + eps)  # the norm is kept
        out = out if scalar and weight == 1.0 else out * weight
    else:
        norm.square_().div_(_scalar(max(x.shape[-1], 1), wide)).add_(_scalar(eps, wide)).rsqrt_()
        out = x * norm
        if not scalar and (weight.dim() > 1 or weight.numel() not in (1, out.shape[-1]) or
                           torch.promote_types(out.dtype, weight.dtype) != out.dtype):
            out = out * weight  # a weight that widens or broadcasts out: out of place
        elif not scalar or weight != 1.0:
            out.mul_(weight)
    dtype = x.dtype if scalar else torch.promote_types(x.dtype, weight.dtype)
    return out if out.dtype == dtype else out.to(dtype)


ACTIVATIONS = {"relu": F.relu, "gelu": lambda y: gelu(y, "none"), "gelu_tanh": lambda y: gelu(y, "tanh")}


def linear(x, weight, bias):
    """x W^T + b. Where finite products add up past the dtype's max, the library's summation order
    (its blocking differs by CPU: AVX2, AVX-512, AVX-512 BF16) makes the sum +inf, -inf or NaN, an
    accident an activation turns into a wrong finite value (relu(+inf) for 0): such outputs are
    summed again in float64, where no sum of float32 products overflows, and rounded once. On CPU
    only, where the check stalls no stream."""
    out = F.linear(x, weight, bias)
    if not device_path(out) and out.dtype != torch.float64 and not out.isfinite().all():
        wide = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
        out = torch.where(out.isfinite(), out, wide.to(out.dtype))
    return out


def linear_act(x, weight, bias, activation):
    return ACTIVATIONS[activation](linear(x, weight, bias))


def _abs_max(x) -> torch.Tensor:
    """max |x| (NaN where x holds one) from one min-max pass, no |x| copy: a 0-d float64 tensor
    on x's device."""
    low, high = torch.aminmax(x.detach())
    return torch.maximum(-low, high).double()  # maximum keeps a NaN


def _score_bound(q, k, scale: float) -> torch.Tensor | float:
    """A bound on |q k^T * scale| from two maxima: O(T D) beside attention's O(T^2 D); NaN or inf
    where q or k holds one. A 0-d float64 tensor on q's device; 0.0 where nothing is bounded."""
    if q.device.type == "meta" or not q.is_floating_point() or not q.numel() or not k.numel():
        return 0.0
    return _abs_max(q) * _abs_max(k) * q.shape[-1] * abs(scale)


def _scores_overflow(q, k, scale: float) -> torch.Tensor | bool:
    """Whether q k^T * scale can overflow (in float32 at least: torch's kernel computes half
    precision scores in it). The fused kernel then returns 0 where the softmax of its definition
    is NaN (and the float64 truth finite), so the definition runs instead. A 0-d bool tensor on
    q's device (False where nothing is bounded): the host path reads it, the device path selects."""
    return _not_below(_score_bound(q, k, scale),
                      torch.finfo(torch.promote_types(q.dtype, torch.float32)).max)


def _not_below(bound: torch.Tensor | float, limit: float) -> torch.Tensor | bool:
    """not bound < limit (NaN is not below), a bool for a float bound, else a bool tensor."""
    return not bound < limit if isinstance(bound, float) else ~(bound < limit)


def _attention(q, k, v, scale: float, bias):
    """The definition: softmax(q k^T * scale + bias) v, with softmax's own +inf semantics; a -inf
    bias masks its score outright, as masked_fill does (an overflowed score stays masked)."""
    scores = q @ k.transpose(-2, -1) * scale
    if bias is not None:
        scores = (scores + bias).masked_fill(torch.isneginf(bias), -math.inf)
    return softmax(scores, -1) @ v


def _torch_sdpa(q, k, v, attn_mask=None, **options):
    """torch's kernel; 3-D operands (one head, or heads folded into the batch) as 4-D ones of one
    head: the CPU flash kernel takes only 4-D operands, and 3-D ones ran the math fallback, 1.5x
    slower than the spelled product at (2, 256, 64) where the 4-D view runs 1.3x faster than it;
    2-D operands (one attention) as a batch of one."""
    if q.dim() == k.dim() == v.dim() == 2:
        return _torch_sdpa(q[None], k[None], v[None], attn_mask, **options)[0]
    if q.dim() == k.dim() == v.dim() == 3:
        mask = attn_mask if attn_mask is None or attn_mask.dim() < 3 else attn_mask.unsqueeze(1)
        return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], attn_mask=mask,
                                              **options)[:, 0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **options)


def sdpa_masked(q, k, v, bias, scale):
    """softmax(q k^T * scale + bias) v, with an additive bias (-inf where masked). A row whose
    every key is masked is NaN, as that softmax is (torch's kernel returns 0 there). Only an
    overflowed or NaN score can tell a -inf bias from masked_fill, and those take the definition.
    A bias that is exactly the causal one runs as ``is_causal``: torch's kernel then skips the
    masked blocks (15% faster at T=256)."""
    if device_path(q):
        return _sdpa_masked_on_device(q, k, v, bias.to(q.dtype), scale)
    if _scores_overflow(q, k, scale):
        return _attention(q, k, v, scale, bias.to(q.dtype))
    if bias.dtype == torch.bool:  # added: True is 1.0, not "keep"
        bias = bias.to(q.dtype)
    causal, dead = _mask_facts(bias, q.shape[-2], k.shape[-2])
    if causal:
        return _torch_sdpa(q, k, v, is_causal=True, scale=scale)
    out = _torch_sdpa(q, k, v, attn_mask=bias.to(q.dtype), scale=scale)
    return out if dead is None else out.masked_fill(dead, float("nan"))


def _sdpa_masked_on_device(q, k, v, bias, scale):
    """sdpa_masked with its guards on the device: the rows every key masks are NaN, and where the
    scores can overflow the definition is selected (computed on every call: knowing it is not
    needed would take a read on the host). The mask is no causal flag: that needs a read too."""
    dead = torch.isneginf(bias).all(-1, keepdim=True)
    out = _torch_sdpa(q, k, v, attn_mask=bias, scale=scale).masked_fill(dead, float("nan"))
    over = _scores_overflow(q, k, scale)
    return out if over is False else torch.where(over, _attention(q, k, v, scale, bias), out)


#: id(bias) -> (weak reference, what identifies its values, its facts); a few masks per program
_MASK_FACTS: dict[int, tuple] = {}


def _mask_facts(mask, queries: int, keys: int) -> tuple[bool, torch.Tensor | None]:
    """(is the mask causal: a key above its query masked, every other kept, for every batch and
    head; the rows whose every key is masked, None where none is). ``mask`` is an additive bias
    (-inf masks, and a causal one is 0 elsewhere) or a boolean keep-mask. Read once per version
    of the mask: a mask buffer, or the bias folded from it, is the same tensor on every call. An
    inference tensor keeps no version counter, so it is read on every call."""
    key = None if mask.is_inference() else \
        (mask.data_ptr(), mask._version, mask.shape, mask.stride(), mask.dtype, mask.device, queries, keys)
    seen = _MASK_FACTS.get(id(mask))
    if key is not None and seen is not None and seen[0]() is mask and seen[1] == key:
        return seen[2]
    keep = mask if mask.dtype == torch.bool else ~torch.isneginf(mask)
    square = mask.shape[-2:] == (queries, keys) and all(n == 1 for n in mask.shape[:-2])
    causal = square and torch.equal(keep.reshape(queries, keys), torch.ones(
        queries, keys, dtype=torch.bool, device=mask.device).tril()) and \
        (mask.dtype == torch.bool or not bool(mask.reshape(queries, keys).tril().any()))
    dead = None if causal else ~keep.any(-1, keepdim=True)
    facts = causal, (dead if dead is not None and bool(dead.any()) else None)
    if key is not None:
        if len(_MASK_FACTS) >= 64:
            _MASK_FACTS.clear()
        _MASK_FACTS[id(mask)] = (weakref.ref(mask), key, facts)
    return facts


#: exp(x) is 0 in float32 (and every narrower dtype) below this: a key whose score lies this far
#: under its row's maximum has weight exactly 0
EXP_UNDERFLOW = -104.0


def sdpa_filled(q, k, v, keep, scale, fill):
    """softmax(where(keep, q k^T * scale, fill)) v: GPT-2's mask, a finite ``fill`` (finfo.min)
    where ``keep`` is False. Where every score s has fill - s below EXP_UNDERFLOW, a masked key
    weighs exactly 0 in a row that keeps one, so torch's kernel runs with ``keep`` as its boolean
    mask; a row that keeps none is the softmax of a constant row: the mean of v. Elsewhere (scores
    too large, a NaN, an infinite fill) the definition runs."""
    def definition():
        return softmax(torch.where(keep, q @ k.transpose(-2, -1) * scale, fill), -1) @ v

    if not math.isfinite(fill):
        return definition()
    slow = _scores_overflow(q, k, scale) | \
        _not_below(_score_bound(q, k, scale), -fill + EXP_UNDERFLOW)
    if device_path(q) and not isinstance(slow, bool):  # the definition selected where needed,
        out = torch.where(~keep.any(-1, keepdim=True), v.mean(-2, keepdim=True),  # on every call
                          _torch_sdpa(q, k, v, attn_mask=keep, scale=scale))
        return torch.where(slow, definition(), out)
    if slow:
        return definition()
    causal, dead = _mask_facts(keep, q.shape[-2], k.shape[-2])
    if causal:
        return _torch_sdpa(q, k, v, is_causal=True, scale=scale)
    out = _torch_sdpa(q, k, v, attn_mask=keep, scale=scale)
    return out if dead is None else torch.where(dead, v.mean(-2, keepdim=True), out)


def sdpa_guarded(q, k, v, bias, scale):
    """softmax(q k^T * scale + bias) v with the dynamo exporter's guard on the weights: each NaN
    weight is 0. A row whose largest score is not finite (every key masked by -inf, an overflow to
    +inf, a NaN) has weights 0 and gives 0 v; elsewhere the guard leaves softmax as it is. Where
    no score can overflow and v is finite, torch's kernel (which gives 0 for a row every -inf
    masks) is that; elsewhere the definition runs."""
    bias = bias.to(q.dtype)

    def definition():
        w = softmax(q @ k.transpose(-2, -1) * scale + bias, -1)
        return torch.where(w.isnan(), 0.0, w) @ v

    if q.device.type == "meta":
        return definition()
    fast = ~(bias.isnan().any() | (bias == math.inf).any()) & v.isfinite().all()
    over = _scores_overflow(q, k, scale)
    fast = fast if over is False else fast & ~over
    if device_path(q):  # the definition selected where needed, computed on every call
        return torch.where(fast, _torch_sdpa(q, k, v, attn_mask=bias, scale=scale), definition())
    return _torch_sdpa(q, k, v, attn_mask=bias, scale=scale) if bool(fast) else definition()


def conv2d(x, weight, bias, stride, padding, dilation, groups):
    """A non-finite weight meets the zero padding (NaN * 0 is NaN): oneDNN's float32 kernel skips
    padded positions, where the half-precision and float64 kernels multiply them, so such a weight
    gets explicit padding (a weight is small: the check is cheap). On the device path, where the
    check would be a read on the host, every padded conv2d gets it: exact for a finite one too."""
    pad = parse_shape(padding)
    if any(pad) and weight.device.type != "meta" and \
            (device_path(weight) or not bool(weight.isfinite().all())):
        x, pad = F.pad(x, tuple(p for p in reversed(pad) for _ in range(2))), (0,) * len(pad)
    y = F.conv2d(x, weight, None if isinstance(bias, float) else bias, parse_shape(stride),
                 pad, parse_shape(dilation), groups)
    return y + bias if isinstance(bias, float) else y


def max_pool2d(x, kernel, stride, padding, dilation):
    """Padding is -inf (never picked): each window's maximum is one of ``x``'s values."""
    return F.max_pool2d(x, parse_shape(kernel), parse_shape(stride), parse_shape(padding),
                        parse_shape(dilation))


def batch_norm(x, mean, var, weight, bias, eps):
    """Inference batch norm over channel axis 1, with running statistics."""
    return F.batch_norm(x, mean, var, weight, bias, False, 0.0, eps)


def softplus(x):
    """log(1 + e^x), exactly: logaddexp(x, 0) has no threshold approximation."""
    return torch.logaddexp(x, torch.zeros_like(x))


def logaddexp(a, b):
    return torch.logaddexp(_tensor(a, b), _tensor(b, a))


def sdpa(q, k, v, scale, causal):
    """Torch's kernel, and the definition for each attention (each leading index: batch, head)
    whose scores can overflow; decided per attention, so one head's result never depends on
    another's values (attention split by heads computes each head alone)."""
    out = _torch_sdpa(q, k, v, is_causal=causal, scale=scale)
    if q.device.type == "meta" or not q.numel() or not k.numel() or \
            not device_path(q) and not _scores_overflow(q, k, scale):
        return out  # on the device path the definition is selected per attention on every call
    limit = torch.finfo(torch.promote_types(q.dtype, torch.float32)).max
    bound = (q.abs().amax((-2, -1)).double() * k.abs().amax((-2, -1)).double() * q.shape[-1] * abs(scale))
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
    bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(mask, -torch.inf)
    definition = _attention(q, k, v, scale, bias if causal else None)
    return torch.where(~(bound < limit)[..., None, None], definition, out)


def swish(x, beta):
    """x * sigmoid(beta x) (Swish; CLIP's quick gelu is beta = 1.702, silu beta = 1), as spelled;
    in place on beta x where autograd keeps no temporaries (one buffer, not three)."""
    gate = x * beta
    if torch.is_grad_enabled() and x.requires_grad:
        return x * torch.sigmoid(gate)
    return gate.sigmoid_().mul_(x)


def geglu(a, b, approximate):
    """gelu(a) * b: GeGLU's gate (Shazeer 2020), gelu's signed zeros kept; the product in place
    on gelu's output where autograd keeps it not and b is its like (the chunk's other half)."""
    out = gelu(a, approximate)
    if isinstance(b, torch.Tensor) and b.shape == out.shape and b.dtype == out.dtype and \
            not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
        return out.mul_(b)
    return out * b


@functools.lru_cache(maxsize=64)
def _half_signs(half: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """-1 over the first half of the last axis, +1 over the second: rotate_half's signs."""
    with torch.inference_mode(False):  # usable outside inference mode too
        ones = torch.ones(half, dtype=dtype, device=device)
        return torch.cat((-ones, ones))


def rotary(x, cos, sin):
    """x cos + rotate_half(x) sin, rotate_half(x) = cat(-x2, x1) over the halves of the last axis
    (transformers' Llama and GPT-NeoX): cat(x2, x1) * (sin * signs), the signs on the smaller of
    sin and x, is the same products exactly. Where autograd keeps none of its temporaries and
    ``sin`` neither widens nor broadcasts x, the rotation is a roll and the products and sum run
    in place on it: 1.5x faster than the spelled form at (2, 4, 256, 16), the same values."""
    half = x.shape[-1] // 2
    tensors = [t for t in (x, cos, sin) if isinstance(t, torch.Tensor)]
    if isinstance(sin, torch.Tensor) and x.shape[-1] == 2 * half and \
            not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) and \
            torch.promote_types(x.dtype, sin.dtype) == x.dtype and sin.dim() <= x.dim() and \
            all([n in (1, m) for n, m in zip(sin.shape[::-1], x.shape[::-1])]):  # broadcast_shapes: 20 us
        rotated, signs = torch.roll(x, half, -1), _half_signs(half, sin.dtype, sin.device)
        if sin.numel() < x.numel():
            rotated.mul_(sin * signs)
        else:
            rotated.mul_(signs).mul_(sin)
        return (x * cos).add_(rotated)
    first, second = x[..., :half], x[..., half:]
    if isinstance(sin, torch.Tensor) and sin.shape[-1:] == x.shape[-1:] and sin.numel() < x.numel() \
            and x.shape[-1] == 2 * half:
        rotated = torch.cat((second, first), -1) * torch.cat((-sin[..., :half], sin[..., half:]), -1)
    else:
        rotated = torch.cat((-second, first), -1) * sin
    return x * cos + rotated


def nll_loss(x, target, reduction, ignore_index):
    """F.nll_loss with class indices (class axis 1): -x[target], 0 where target is ignore_index;
    "mean" divides by the count of targets not ignored (NaN when every one is)."""
    return F.nll_loss(x, target, reduction=reduction, ignore_index=ignore_index)


def cross_entropy(x, target, reduction, ignore_index):
    """nll_loss(log_softmax(x, 1)) by torch's own kernel (F.cross_entropy); where that is NaN (a
    row holding NaN or +inf, or no target kept), by the composition itself, whose log_softmax
    keeps the naive quotient's value at +inf (+inf off the +inf logit, where torch's is NaN)."""
    if x.device.type != "meta" and device_path(x):  # torch's kernel is this composition: no check
        return nll_loss(log_softmax(x, 1 if x.dim() > 1 else 0), target, reduction, ignore_index)
    out = F.cross_entropy(x, target, reduction=reduction, ignore_index=ignore_index)
    if x.device.type == "meta" or not bool(out.isnan().any()):
        return out
    return nll_loss(log_softmax(x, 1 if x.dim() > 1 else 0), target, reduction, ignore_index)


def rsqrt(x):
    return torch.rsqrt(x)


def sigmoid(v: float) -> float:
    """The logistic function on a float (the increasing function sigmoid's range is the image of)."""
    return 1 / (1 + math.exp(-v)) if v > -700 else 0.0


def relu(v: float) -> float:
    return max(v, 0.0)


#: facts the stages need of every non-leaf op (``flops`` too, for the per-element work kinds)
FACTS = ("shape", "range", "bounds", "sign", "curvature", "growth", "error", "rounding", "passes",
         "precision", "work", "onnx", "layout")
PER_ELEMENT_WORK = ("pointwise", "select", "reduce", "along", "loss")


def _op(name, arity, attrs, impl, family: dict, **facts) -> Op:
    """An op from its family's facts, overridden or completed by its own."""
    pairs = tuple(tuple(a.split(":")) for a in attrs.split()) if attrs else ()
    return Op(name, arity, pairs, impl, **{**family, **facts})


_AXIS = "axis:i64"
_REDUCE = "axis:i64 keepdim:bool"
_WINDOW = "stride:String padding:String dilation:String"  # per spatial dim, as shape_attr strings

# facts shared by a family of ops; a row completes them and may override them
_ANY = dict(bounds=UNBOUNDED, sign="any", error="none", layout="fresh")
_LEAF = dict(_ANY, curvature=LINEAR, growth=0, rounding="exact", passes=0, precision="keep")
_BINARY = dict(_ANY, shape="broadcast", rounding="rounds", passes=2, precision="hoist",
               work="pointwise", flops=1, layout="runs")
_UNARY = dict(_ANY, shape="same", rounding="rounds", passes=2, precision="hoist", work="pointwise",
              flops=10, layout="runs")
_REDUCTION = dict(_ANY, shape="reduce", curvature=LINEAR, growth=0, rounding="rounds", passes=4,
                  precision="accumulate", work="reduce", flops=1)
_LAYOUT = dict(_ANY, shape="meta", range="values", curvature=LINEAR, growth=0, rounding="exact",
               passes=1, precision="hoist", work="static", layout="view")
_FUSED = dict(_ANY, rounding="rounds", precision="accumulate", work="static", layout="runs")
#: mesh ops: shapes on one device by running them on meta tensors; priced by sharding/cost.py
_MESH = dict(_ANY, shape="meta", curvature=LINEAR, growth=0, precision="keep", work="static",
             onnx="none", mesh="parts")
_SMOOTH = dict(growth=1)  # bounded curvature
_EXACT = dict(curvature=LINEAR, growth=0, rounding="exact")  # piecewise linear, no rounding
_MATMUL_SAMPLE = (("x0", (3, 5)), ("x1", (4, 5)), ("x2", (4,)))  # linear's (x, weight, bias)
_ATTENTION_SAMPLE = (("x0", (2, 4, 3)), ("x1", (2, 5, 3)), ("x2", (2, 5, 3)))
_GUARDED = "(softmax (add (mul (matmul ?x0 (transpose ?x1 -2 -1)) (const ?scale)) ?x3) -1)"

OPS: dict[str, Op] = {op.name: op for op in [
    # leaves: program inputs, parameters (by name), scalar constants, opaque calls (by node name)
    _op("input", 0, "name:String shape:String dtype:String", None, _LEAF),
    _op("param", 0, "name:String shape:String dtype:String", None, _LEAF),
    _op("const", 0, "value:f64", None, _LEAF),
    _op("opaque", 0, "name:String", None, _LEAF),
    # elementwise, broadcasting
    _op("add", 2, "", operator.add, _BINARY, infix="+", range="add", curvature=LINEAR, growth=0,
        error="cancels", onnx="Add"),
    _op("sub", 2, "", operator.sub, _BINARY, infix="-", range="sub", curvature=LINEAR, growth=0,
        error="cancels", onnx="Sub"),
    _op("mul", 2, "", operator.mul, _BINARY, infix="*", range="mul", curvature="bilinear", growth=1,
        onnx="Mul"),
    _op("div", 2, "", operator.truediv, _BINARY, infix="/", range="div", curvature="div", growth=2,
        onnx="Div"),
    _op("pow", 2, "", operator.pow, _BINARY, infix="**", range="pow", curvature="pow", growth=2,
        precision="keep", flops=10, onnx="Pow"),
    _op("maximum", 2, "", maximum, _BINARY, range="maximum", **_EXACT, onnx="Max"),
    _op("minimum", 2, "", minimum, _BINARY, range="minimum", **_EXACT, onnx="Min"),
    _op("where", 3, "", where, _BINARY, shape="where", range="select", **_EXACT, precision="keep",
        work="select", onnx="Where"),
    _op("less", 2, "", operator.lt, _BINARY, infix="<", shape="compare", range="bounds",
        bounds=(0.0, 1.0), sign="nonneg", **_EXACT, precision="keep", onnx="Less"),  # a bool
    # mask: the condition of a piecewise program (extractors/regimes.py)
    _op("isnan", 1, "", torch.isnan, _UNARY, shape="compare", range="bounds", bounds=(0.0, 1.0),
        sign="nonneg", **_EXACT, precision="keep", flops=1, onnx="IsNaN"),  # a bool; the dynamo
    # exporter's softmax guard (sdpa_guarded)
    _op("logical_not", 1, "", torch.logical_not, _UNARY, shape="compare", range="bounds",
        bounds=(0.0, 1.0), sign="nonneg", **_EXACT, precision="keep", flops=1, onnx="Not"),  # of a
    # bool: the keys masked_fill(mask, fill) keeps (sdpa_filled)
    _op("neg",     1, "", operator.neg, _UNARY, range="neg",     **_EXACT, flops=1, onnx="Neg",
        numpy="negative"),
    _op("exp",     1, "", torch.exp,    _UNARY, range=math.exp,  curvature="exp",   growth=3,
        sign="positive", error="exp", onnx="Exp", numpy="exp"),
    _op("log",     1, "", torch.log,    _UNARY, range="log",     curvature="log",   growth=2,
        error="log", onnx="Log", numpy="log"),
    _op("log1p",   1, "", torch.log1p,  _UNARY, range="log1p",   curvature="log1p", growth=2,
        onnx="kahan-log1p", numpy="log1p"),
    _op("expm1",   1, "", torch.expm1,  _UNARY, range=math.expm1, curvature="exp",  growth=3,
        error="exp", onnx="kahan-expm1", numpy="expm1"),
    _op("sqrt",    1, "", torch.sqrt,   _UNARY, range="sqrt",    curvature="sqrt",  growth=2,
        sign="nonneg", onnx="Sqrt", numpy="sqrt"),
    _op("rsqrt",   1, "", rsqrt,        _UNARY, range="rsqrt",   curvature="rsqrt", growth=2,
        onnx="definition", definition="(div (const 1.0) (sqrt ?x0))"),
    _op("abs",     1, "", torch.abs,    _UNARY, range="abs",     **_EXACT, sign="nonneg", flops=1,
        onnx="Abs", numpy="abs"),
    _op("sin",     1, "", torch.sin,    _UNARY, range="bounds",  curvature=(1.0, 1.0), **_SMOOTH,
        bounds=(-1.0, 1.0), onnx="Sin", numpy="sin"),
    _op("cos",     1, "", torch.cos,    _UNARY, range="bounds",  curvature=(1.0, 1.0), **_SMOOTH,
        bounds=(-1.0, 1.0), onnx="Cos", numpy="cos"),
    _op("tanh",    1, "", torch.tanh,   _UNARY, range=math.tanh, curvature=(0.77, 1.0), **_SMOOTH,
        bounds=(-1.0, 1.0), onnx="Tanh", numpy="tanh"),
    _op("sigmoid", 1, "", torch.sigmoid, _UNARY, range=sigmoid,  curvature=(0.097, 0.25), **_SMOOTH,
        bounds=(0.0, 1.0), sign="positive", onnx="Sigmoid"),
    _op("relu",    1, "", torch.relu,   _UNARY, range=relu,      **_EXACT, sign="nonneg", flops=1,
        onnx="Relu"),
    _op("erf",     1, "", torch.erf,    _UNARY, range=math.erf,  curvature=(0.97, 1.0), **_SMOOTH,
        onnx="Erf"),
    _op("silu",    1, "", F.silu,       _UNARY, range="silu",    curvature=(0.5, 1.1), **_SMOOTH,
        onnx="definition", definition="(mul ?x0 (sigmoid ?x0))"),  # x * sigmoid(x), one pass
    _op("gelu",    1, "approximate:String", gelu, _UNARY, range="gelu", curvature=(0.8, 1.0),
        **_SMOOTH, sample=(("approximate", "tanh"),), onnx="Gelu"),
    _op("swish",   1, "beta:f64", swish, _UNARY, range="swish", curvature="swish", **_SMOOTH,
        flops=12, sample=(("beta", 1.702),), onnx="definition",
        definition="(mul ?x0 (sigmoid (mul ?x0 (const ?beta))))"),  # quick gelu, one op
    # trigonometric, hyperbolic and root functions (issue 16): the forms cancellation rules reach.
    # Bounds are float32's roundings of pi/2 and pi, outward (atan(inf) is 1.5707964 > pi/2)
    _op("tan",     1, "", torch.tan,    _UNARY, range="tan",     curvature=(math.inf, math.inf),
        growth=2, onnx="Tan"),
    _op("atan",    1, "", torch.atan,   _UNARY, range=math.atan, curvature=(0.65, 1.0), **_SMOOTH,
        bounds=(-1.5708, 1.5708), onnx="Atan"),
    _op("atan2",   2, "", atan2,        _BINARY, range="bounds", curvature="div", growth=2,
        bounds=(-3.1416, 3.1416), flops=20, precision="keep", onnx="quadrant-atan"),
    _op("hypot",   2, "", hypot,        _BINARY, range="hypot",  curvature=(1.0, 1.0), **_SMOOTH,
        sign="nonneg", flops=10, precision="keep", onnx="definition",
        definition="(sqrt (add (mul ?x0 ?x0) (mul ?x1 ?x1)))"),
    _op("cbrt",    1, "", cbrt,         _UNARY, range=cube_root, curvature="sqrt", growth=2,
        onnx="signed-cube-root"),
    _op("asinh",   1, "", torch.asinh,  _UNARY, range=math.asinh, curvature=(0.39, 1.0), **_SMOOTH,
        onnx="Asinh"),
    _op("acosh",   1, "", torch.acosh,  _UNARY, range=math.acosh, curvature=(math.inf, math.inf),
        growth=2, onnx="Acosh"),
    _op("atanh",   1, "", torch.atanh,  _UNARY, range=math.atanh, curvature=(math.inf, math.inf),
        growth=2, onnx="Atanh"),
    # reductions over one axis (axes are canonical: negative, counted from the end)
    _op("sum", 1, _REDUCE, reduce_sum, _REDUCTION, range="sum", error="sum", onnx="ReduceSum"),
    _op("compensated_sum", 1, _REDUCE, compensated_sum, _REDUCTION, range="sum", passes=12, flops=8,
        onnx="float64-sum"),
    _op("max", 1, _REDUCE, reduce_max, _REDUCTION, range="operand", rounding="exact",
        precision="keep", onnx="ReduceMax"),
    _op("mean", 1, _REDUCE, reduce_mean, _REDUCTION, range="operand", onnx="ReduceMean"),
    _op("var", 1, _REDUCE + " correction:i64", var, _REDUCTION, range="var", sign="nonneg",
        curvature=(2.0, 1.0), growth=1, passes=6, flops=3, onnx="mean-of-squares"),
    # linear algebra and layout
    _op("matmul", 2, "", operator.matmul, _FUSED, infix="@", shape="matmul", range="matmul",
        curvature="bilinear", growth=1, passes=16, sample=(("x0", (3, 5)), ("x1", (5, 4))),
        work="matmul", onnx="MatMul", layout="fresh"),
    _op("transpose", 1, "dim0:i64 dim1:i64", torch.transpose, _LAYOUT, shape="transpose",
        onnx="Transpose"),
    _op("permute", 1, "perm:String", permute, _LAYOUT, sample=(("perm", "0,2,3,1"),),
        onnx="Transpose"),
    _op("reshape", 1, "shape:String", reshape, _LAYOUT, shape="reshape",
        sample=(("shape", "6,25"),), onnx="Reshape"),
    _op("expand", 1, "shape:String", expand, _LAYOUT, shape="reshape",
        sample=(("x0", (2, 3, 1, 5)), ("shape", "2,3,4,5")), onnx="Expand"),
    _op("gather", 2, _AXIS, gather, _LAYOUT, range="operand", passes=2, precision="keep",
        onnx="GatherElements", layout="fresh"),
    _op("index_select", 2, _AXIS, index_select, _LAYOUT, range="operand", passes=2,
        precision="keep", onnx="Gather", layout="fresh"),
    _op("slice", 1, "axis:i64 start:i64 end:i64 step:i64", slice_, _LAYOUT, range="operand",
        sample=(("axis", -1), ("start", 1), ("end", 4), ("step", 2)), onnx="Slice"),
    _op("concat", 2, _AXIS, concat, _LAYOUT, range="hull", passes=2, precision="keep",
        onnx="Concat", layout="fresh"),
    _op("cast", 1, "dtype:String", cast, _LAYOUT, shape="cast", rounding="widening", passes=2,
        precision="keep", onnx="Cast", layout="runs"),
    # composites: each has a definition in primitives (checked in tests) and stable kernels
    _op("softmax", 1, _AXIS, softmax, _FUSED, shape="same", range="bounds", bounds=(0.0, 1.0),
        sign="nonneg", curvature=(1.0, 1.0), **_SMOOTH, error="shifted-exp", passes=5,
        work="along", flops=12, onnx="Softmax"),
    _op("log_softmax", 1, _AXIS, log_softmax, _FUSED, shape="same", range="log_softmax",
        curvature=(0.5, 1.0), **_SMOOTH, error="log-sum-exp", passes=5, work="along", flops=12,
        onnx="LogSoftmax"),
    _op("logsumexp", 1, _REDUCE, logsumexp, _FUSED, shape="reduce", range="logsumexp",
        curvature=(0.5, 1.0), **_SMOOTH, error="log-sum-exp", passes=5, work="reduce", flops=12,
        onnx="ReduceLogSumExp", layout="fresh"),
    _op("softplus", 1, "", softplus, _UNARY, range="softplus", curvature=(0.25, 1.0), **_SMOOTH,
        work="static", onnx="Softplus"),
    _op("logaddexp", 2, "", logaddexp, _BINARY, range="logaddexp", curvature=(0.25, 1.0),
        **_SMOOTH, precision="keep", work="static", onnx="stable-logaddexp"),
    _op("layer_norm", 3, "eps:f64", layer_norm, _FUSED, shape="first", range="layer_norm",
        curvature="layer_norm", growth=2, passes=6,
        sample=(("x0", (3, 5)), ("x1", (5,)), ("x2", (5,)), ("eps", 1e-5)), work="layer_norm",
        onnx="LayerNormalization"),
    _op("rms_norm", 2, "eps:f64", rms_norm, _FUSED, shape="broadcast", range="rms_norm",
        curvature="layer_norm", growth=2, passes=4, precision="keep",  # accumulates in float32 itself
        sample=(("x0", (3, 5)), ("x1", (5,)), ("eps", 1e-6)), work="rms_norm",
        onnx="RMSNormalization"),
    _op("sdpa", 3, "scale:f64 causal:bool", sdpa, _FUSED, shape="sdpa", range="values-of-v",
        curvature=(1.0, 1.0), **_SMOOTH, passes=20,
        sample=(*_ATTENTION_SAMPLE, ("scale", 0.5), ("causal", False)), work="sdpa",
        onnx="Attention"),
    _op("geglu", 2, "approximate:String", geglu, _FUSED, shape="broadcast", range="geglu",
        curvature="bilinear", growth=1, passes=3, precision="keep", onnx="definition",
        definition="(mul (gelu ?x0 ?approximate) ?x1)"),
    _op("rotary", 3, "", rotary, _FUSED, shape="broadcast", range="rotary", curvature="bilinear",
        growth=1, error="rotation", passes=5, precision="keep", onnx="rotate-half"),
    # losses over class indices (class axis 1); targets equal to ignore_index count for nothing
    _op("nll_loss", 2, "reduction:String ignore_index:i64", nll_loss, _FUSED, shape="meta",
        range="top", curvature=LINEAR, growth=0, error="sum", passes=1, precision="keep",
        onnx="NegativeLogLikelihoodLoss"),
    _op("cross_entropy", 2, "reduction:String ignore_index:i64", cross_entropy, _FUSED,
        shape="meta", range="top", sign="nonneg", curvature=(0.5, 1.0), **_SMOOTH,
        error="log-sum-exp", passes=3, precision="keep", work="loss", flops=12,
        onnx="SoftmaxCrossEntropyLoss"),
    _op("linear", 3, "", linear, _FUSED, shape="linear", range="linear", curvature="bilinear",
        growth=1, passes=17, sample=_MATMUL_SAMPLE, work="linear", onnx="Gemm", layout="fresh"),
    _op("linear_act", 3, "activation:String", linear_act, _FUSED, shape="linear",
        range="linear_act", curvature=(1.0, 1.0), **_SMOOTH, passes=17,
        sample=(*_MATMUL_SAMPLE, ("activation", "gelu_tanh")), work="linear",
        onnx="linear-activation", layout="fresh"),
    _op("sdpa_masked", 4, "scale:f64", sdpa_masked, _FUSED, shape="sdpa", range="values-of-v",
        curvature=(1.0, 1.0), **_SMOOTH, passes=21,
        sample=(*_ATTENTION_SAMPLE, ("x3", (4, 5)), ("scale", 0.5)), onnx="Attention"),
    _op("sdpa_filled", 4, "scale:f64 fill:f64", sdpa_filled, _FUSED, shape="sdpa",
        range="values-of-v", curvature=(1.0, 1.0), **_SMOOTH, passes=21, precision="keep",  # a
        # boolean operand: no float32 copy of it; torch's kernel accumulates in float32 itself
        onnx="definition", definition="(matmul (softmax (where ?x3 (mul (matmul ?x0 (transpose ?x1 "
        "-2 -1)) (const ?scale)) (const ?fill)) -1) ?x2)"),
    _op("sdpa_guarded", 4, "scale:f64", sdpa_guarded, _FUSED, shape="sdpa", range="values-of-v",
        curvature=(1.0, 1.0), **_SMOOTH, passes=21,
        sample=(*_ATTENTION_SAMPLE, ("x3", (4, 5)), ("scale", 0.5)), onnx="Attention",
        definition=f"(matmul (where (isnan {_GUARDED}) (const 0.0) {_GUARDED}) ?x2)"),
    _op("conv2d", 3, _WINDOW + " groups:i64", conv2d, _FUSED, shape="meta", range="linear",
        curvature="bilinear", growth=1, passes=24,
        sample=(("x0", (2, 3, 6, 6)), ("x1", (4, 3, 3, 3)), ("x2", (4,)), ("stride", "1,1"),
                ("padding", "1,1"), ("dilation", "1,1"), ("groups", 1)), onnx="Conv", layout="fresh"),
    _op("max_pool2d", 1, "kernel:String " + _WINDOW, max_pool2d, _LAYOUT, range="operand",
        passes=2, sample=(("x0", (2, 3, 6, 6)), ("kernel", "2,2"), ("stride", "2,2"),
                          ("padding", "0,0"), ("dilation", "1,1")), onnx="MaxPool", layout="fresh"),
    _op("batch_norm", 5, "eps:f64", batch_norm, _FUSED, shape="first", range="top", curvature=LINEAR,
        growth=0, passes=6, precision="keep", onnx="BatchNormalization"),
    # ---- sharding: place and move values over a mesh of n devices (lang/mesh.py; rulesets/sharding.py)
    _op("shard", 1, "axis:i64 n:i64", mesh.shard, _MESH, range="operand", rounding="exact", passes=1),
    _op("all_gather", 1, "axis:i64 n:i64", mesh.all_gather, _MESH, range="values", rounding="exact",
        passes=2, mesh="whole"),
    _op("all_reduce", 1, "n:i64", mesh.all_reduce, _MESH, range="top", rounding="rounds", error="sum",
        passes=2, mesh="whole"),
    _op("reduce_scatter", 1, "axis:i64 n:i64", mesh.reduce_scatter, _MESH, range="top",
        rounding="rounds", error="sum", passes=2),
    # ---- the rest of the Core ATen opset's elementwise math (frontends/lowering_core.py)
    _op("floor", 1, "", torch.floor, _UNARY, range=math.floor, **_EXACT, flops=1, precision="keep", onnx="Floor"),
    _op("ceil", 1, "", torch.ceil, _UNARY, range=math.ceil, **_EXACT, flops=1, precision="keep", onnx="Ceil"),
    _op("round", 1, "", torch.round, _UNARY, range=round, **_EXACT, flops=1, precision="keep", onnx="Round"),  # half to even
    _op("trunc", 1, "", torch.trunc, _UNARY, range=math.trunc, **_EXACT, flops=1, precision="keep", onnx="none"),
    _op("asin", 1, "", torch.asin, _UNARY, range="bounds", bounds=(-1.5708, 1.5708), curvature=(math.inf, math.inf), growth=2, onnx="Asin"),
    _op("acos", 1, "", torch.acos, _UNARY, range="bounds", bounds=(0.0, 3.1416), sign="nonneg", curvature=(math.inf, math.inf), growth=2, onnx="Acos"),
    _op("sinh", 1, "", torch.sinh, _UNARY, range=math.sinh, curvature="exp", growth=3, error="exp", onnx="Sinh"),
    _op("cosh", 1, "", torch.cosh, _UNARY, range="bounds", bounds=(1.0, math.inf), sign="positive", curvature="exp", growth=3, error="exp", onnx="Cosh"),
    _op("log2", 1, "", torch.log2, _UNARY, range=math.log2, curvature="log", growth=2, error="log", onnx="none"),
    _op("log10", 1, "", torch.log10, _UNARY, range=math.log10, curvature="log", growth=2, error="log", onnx="none"),
    _op("fmod", 2, "", fmod, _BINARY, range="top", curvature=(math.inf, math.inf), growth=2, precision="keep", onnx="none"),
    _op("remainder", 2, "", remainder, _BINARY, range="top", curvature=(math.inf, math.inf), growth=2, precision="keep", onnx="none"),
]}

BY_EGG_NAME = {op.egg_name: op for op in OPS.values()}
