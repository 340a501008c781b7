"""The torch kernel of each op whose reference (``lang/ops.py``) has a faster path: the same values, with guards that
skip a pass where no extreme value needs it, caches of facts asked once (a kernel's repairs, a mask's causality),
in-place arithmetic where autograd keeps no temporaries, and torch's fused kernels with the definition where they
would be wrong. ``TORCH`` maps each op to it; the registry's torch kernels and every run of a plan use it."""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import weakref
from typing import Callable

import torch
import torch.nn.functional as F

from egraph_opt.lang import ops
from egraph_opt.lang.ops import OPS, parse_shape

#: set by tests: guards take the device path on CPU too, as on CUDA (``device_path``)
_FORCED_DEVICE_PATH = contextvars.ContextVar("forced_device_path", default=False)


def device_path(x: torch.Tensor) -> bool:
    """Whether a guard on ``x``'s values stays on its device (computed there, selected with ``torch.where``): on CUDA a
    host read (``float()``, ``bool()``, ``.item()``) stalls the stream, and four cost more than an attention; on CPU a
    read costs nothing and a check that skips a pass is cheaper. Tests force it with ``forcing_device_path``."""
    return x.device.type != "cpu" or _FORCED_DEVICE_PATH.get()


class _Assumed:
    """What the host path's guards of one run of a plan assumed instead of reading (``speculating``): that
    ``tensors`` hold no inf or NaN, nor ``reciprocals`` a 0 or NaN, and that M^2 < ``square`` for the largest
    magnitude M among them all (a bound on each product of maxima, the scores' guard). Read after the run, in one
    pass. A view of a tensor recorded whole (attention's q, a slice of the QKV linear) is not recorded again; the
    tensors are held, so no id in ``whole`` is reused while the run lasts."""

    __slots__ = ("tensors", "reciprocals", "square", "whole", "guards")

    def __init__(self):
        self.tensors, self.reciprocals, self.square, self.whole, self.guards = [], [], math.inf, set(), 0

    def held(self) -> bool:
        with torch.no_grad():
            tensors = self.tensors + (list(torch._foreach_reciprocal(self.reciprocals)) if self.reciprocals else [])
            if not tensors:
                return True
            small = [t.reshape(-1) for t in tensors if t.numel() <= 1 << 12]  # a decode step's: one copy, one pass
            tensors = [t for t in tensors if t.numel() > 1 << 12] + ([torch.cat(small)] if small else [])
            lows, highs = zip(*(torch.aminmax(t) for t in tensors))  # the others each where it lies (a copy: a pass)
            low, high = torch.stack([torch.stack(lows).min(), torch.stack(highs).max()]).tolist()  # NaN where one is
        top = max(-low, high)  # squared only under a scores' bound: a float64 plan's 1e200 is finite, its square not
        return math.isfinite(low) and math.isfinite(high) and (self.square == math.inf or top * top < self.square)


#: the assumptions of the plan running in this thread (``speculating``), or None: each guard reads now
_ASSUMED: contextvars.ContextVar[_Assumed | None] = contextvars.ContextVar("assumed", default=None)


def _assumes(*tensors: torch.Tensor, reciprocal: bool = False) -> _Assumed | None:
    """Where a plan speculates: records that ``tensors`` (floating, on the host path) hold no inf or NaN (with
    ``reciprocal``: no 0 or NaN), to be read with the rest after the run; None where the guard must read now."""
    if (assumed := _ASSUMED.get()) is None or any(t.numel() > SPECULATE_UP_TO for t in tensors):
        return None
    assumed.guards += 1
    for t in tensors:
        if reciprocal and t.numel():
            assumed.reciprocals.append(t)
        elif not reciprocal and t.numel() and id(t._base) not in assumed.whole:
            assumed.tensors.append(t)  # a view of every element in place (F.linear's 3-D output of its 2-D
            base = t._base  # product) stands for its base, whose other views (q, k sliced from it) are not read again
            assumed.whole.add(id(base if base is not None and t.numel() == base.numel() and t.is_contiguous() and
                                 base.is_contiguous() and t.storage_offset() == base.storage_offset() else t))
    return assumed


#: a guard on a tensor of more elements reads at once: its read costs little beside its op, and a run holding every
#: such tensor to its end would hold a whole prefill's activations
SPECULATE_UP_TO = 1 << 16


def speculating(forward: Callable, writes: bool = False) -> Callable:
    """``forward`` (a plan's run: refusing random draws) run with each host-path guard assuming its fast case, then
    every assumption read at once (on CPU a small reduction and a host read cost microseconds each, as much as the op
    they guard); where one fails, run again with each guard reading its own: the careful result where needed. A plan
    whose run met fewer than ``SPECULATE_FROM`` guards reads each (a joint read's few ops cost more: a Qwen2 decode
    step, four guards, ran 3% slower); one that ``writes`` its arguments back too (a rerun would read what it wrote)."""
    if writes:
        return forward
    met = [SPECULATE_FROM]  # guards the last speculating run met
    def run(*args):
        if met[0] < SPECULATE_FROM:
            return forward(*args)
        token = _ASSUMED.set(assumed := _Assumed())
        try:
            out = forward(*args)
        finally:
            _ASSUMED.reset(token)
        met[0] = assumed.guards
        return out if assumed.held() else forward(*args)
    return run


#: speculate where a plan's run meets at least this many guards (decode steps, interleaved: GPT-2's 15, 7% faster;
#: Qwen2's 4, 3% slower; Llama's 2, 3% slower)
SPECULATE_FROM = 8


@contextlib.contextmanager
def forcing_device_path():
    """Guards take the device path on CPU tensors too (tests: no host reads while a plan runs)."""
    token = _FORCED_DEVICE_PATH.set(True)
    try:
        yield
    finally:
        _FORCED_DEVICE_PATH.reset(token)


def gelu(x, approximate):
    """x * Phi(x), repaired where torch's kernel for this device and dtype is off (asked once, ``_gelu_repairs``):
    some (AVX2 CPUs') return +0 at -0 and where Phi(x) underflows, so the sign of x is put back; some (the erf form on
    AVX-512 CPUs) compute x (1 + erf) first, NaN at +inf and +inf above max / 2, so where the output's maximum is not
    finite, x > 8 (Phi(x) = 1 in every dtype) is x."""
    out = F.gelu(x, approximate=approximate)
    if x.device.type == "meta" or not out.numel():
        return out
    sign, top = _gelu_repairs(x.device.type, x.dtype, approximate)
    if sign:
        out.copysign_(x)  # in place: its own output
    if top and (device_path(x) or not (_assumes(out) or math.isfinite(out.amax().item()))):  # NaN too
        out = torch.where(x > 8, x, out)
    return out


@functools.cache
def _gelu_repairs(device: str, dtype: torch.dtype, approximate: str) -> tuple[bool, bool]:
    """Whether torch's gelu kernel for this device and dtype loses the sign of x where the result is 0, and whether it
    gets +inf or the dtype's max wrong; on vectors that take the vectorized path and its scalar tail."""
    big = torch.finfo(dtype).max
    negative = torch.tensor([-0.0, -100.0, -big] * 33, dtype=dtype, device=device)
    top = torch.tensor([math.inf, big] * 33, dtype=dtype, device=device)
    sign_lost = not bool(F.gelu(negative, approximate=approximate).signbit().all())
    return sign_lost, not torch.equal(F.gelu(top, approximate=approximate), top)


def _skipping_posinf(fast, reference):
    """``reference`` (its values where a row holds +inf), or ``fast`` where a host read of the rows' maxima finds none
    (the usual case: no more passes); on a GPU the read would stall the stream, so the reference runs on every call."""
    def kernel(x, axis):
        return fast(x, axis) if not device_path(x) and x.is_floating_point() and x.numel() and \
            not bool((torch.amax(x, dim=axis) == torch.inf).any()) else reference(x, axis)
    return kernel


softmax = _skipping_posinf(torch.softmax, ops.softmax)
log_softmax = _skipping_posinf(torch.log_softmax, ops.log_softmax)


def _normalized(x, weight, bias, eps):
    """F.layer_norm over the last axis. In float32 a row whose variance overflows (|x| beyond ~sqrt(max / n)) gives 0
    or NaN where the normalized row is finite: torch's kernel returns each row's 1/std with it, 0 or NaN exactly
    there, so one pass over the rows (not over x) finds them, and they are recomputed in float64. Narrower dtypes
    accumulate in float32, which cannot overflow on their values."""
    out, _, rstd = torch.native_layer_norm(x, x.shape[-1:], weight, bias, eps)
    if x.device.type == "meta" or x.dtype != torch.float32 or not x.numel():
        return out
    if not device_path(x):  # on the device, the where below runs on every call
        if _assumes(rstd, reciprocal=True) and (eps > 0 or _assumes(rstd)):  # eps > 0: a finite 1/std
            return out
        low, high = (float(r) for r in torch.aminmax(rstd))
        if 0 < low and high < math.inf:  # False where one is NaN
            return out
    wrong = ~((rstd > 0) & rstd.isfinite())  # a row holding inf or NaN too: float64 gives NaN there
    wide = [None if t is None else t.double() for t in (weight, bias)]
    return torch.where(wrong, F.layer_norm(x.double(), x.shape[-1:], *wide, eps).to(out.dtype), out)


def layer_norm(x, weight, bias, eps):
    """Over the last axis; an affine-free spelling carries scalar consts as weight and bias."""
    return _normalized(x, weight, bias, eps) if not isinstance(weight, float) and not isinstance(bias, float) \
        else _normalized(x, None, None, eps) * weight + bias  # tensors (or None), else numbers


@functools.lru_cache(maxsize=64)
def _scalar(value: float, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as a 0-dim CPU tensor any device's op takes (a number is wrapped per call); never written to."""
    with torch.inference_mode(False):  # usable outside inference mode too
        return torch.tensor(value, dtype=dtype)


def rms_norm(x, weight, eps):
    """The reference's values, where autograd keeps none of its temporaries in place on them, its
    constants 0-dim tensors: on small rows the chain of small ops costs more than the passes."""
    scalar = isinstance(weight, float)
    if torch.is_grad_enabled() and (x.requires_grad or not scalar and weight.requires_grad):
        return ops.rms_norm(x, weight, eps)  # the norm is kept
    wide = torch.promote_types(x.dtype, torch.float32)
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=wide)
    norm.square_().div_(_scalar(max(x.shape[-1], 1), wide)).add_(_scalar(eps, wide)).rsqrt_()
    out = x * norm
    if not scalar and (weight.dim() > 1 or weight.numel() not in (1, out.shape[-1]) or
                       torch.promote_types(out.dtype, weight.dtype) != out.dtype):
        out = out * weight  # a weight that widens or broadcasts out: out of place
    elif not scalar or weight != 1.0:
        out.mul_(weight)
    dtype = x.dtype if scalar else torch.promote_types(x.dtype, weight.dtype)
    return out if out.dtype == dtype else out.to(dtype)


def all_finite(x: torch.Tensor) -> bool:
    """Whether ``x`` (narrower than float64) holds no inf or NaN, from one pass and one number (cheaper than a mask, or
    a float64 sum): its float32 sum is inf or NaN where an element is, and otherwise only where finite values add up
    past float32's max, a rare "no" for a "yes" (callers then take their careful path, never a wrong one). Where the
    plan speculates, assumed (True) and read after the run."""
    return bool(x.is_floating_point() and _assumes(x)) or math.isfinite(x.sum(dtype=torch.float32).item())


def linear(x, weight, bias):
    """x W^T + b. Where finite products add up past the dtype's max, the library's summation order (its blocking
    differs by CPU: AVX2, AVX-512, AVX-512 BF16) makes the sum +inf, -inf or NaN, which an activation turns into a
    wrong finite value (relu(+inf) for 0): those outputs are summed again in float64 and rounded once. CPU only."""
    if not device_path(out := F.linear(x, weight, bias)) and out.dtype != torch.float64 and not all_finite(out):
        wide = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
        out = torch.where(out.isfinite(), out, wide.to(out.dtype))
    return out


def linear_add(x, weight, bias, residual):
    """linear(x, W, b) + r: one oneDNN call on CPU in float32, r of the output's shape, autograd off
    (it has no backward); where that gives an inf or NaN, the definition, with ``linear``'s care."""
    tensors = [t for t in (x, weight, bias, residual) if t is not None]
    if not device_path(x) and torch.backends.mkldnn.is_available() and weight.dim() == 2 and x.shape[-1] > 0 \
            and all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in tensors) \
            and residual.shape == (*x.shape[:-1], weight.shape[0]) \
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        if all_finite(out := torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, bias, "add")):
            return out
    return linear(x, weight, bias) + residual


def linear_scaled(x, weight, bias, scale):
    """linear(x, W, b) * scale for scale = +-2^k (the rule's guard). For k >= 0, one GEMM with alpha = beta = scale:
    scaling by 2^k commutes with each rounding of the sums, so the two differ only where a scaled partial sum
    overflows (there the definition runs, with ``linear``'s care). For k < 0 the scaled sums round otherwise under
    the smallest normal, and finding those costs a pass more than the scale: linear's output is scaled in place."""
    if abs(scale) >= 1 and x.is_floating_point() and weight.dim() == 2 and torch.is_tensor(bias) and x.numel() \
            and weight.numel():
        out = torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight.t(), beta=scale, alpha=scale)
        if device_path(x) or all_finite(out):
            return out.reshape(*x.shape[:-1], weight.shape[0])
    return linear(x, weight, bias).mul_(scale)


def linear_act(x, weight, bias, activation):
    op, attrs = ops.ACTIVATIONS[activation]
    return TORCH.get(op, OPS[op].impl)(linear(x, weight, bias), *attrs)


def _abs_max(x) -> torch.Tensor | float:
    """max |x| (NaN where x holds one) from one min-max pass, no |x| copy: a 0-d float64 tensor
    on the device path, else a float (two reads on the host cost less than more kernels)."""
    low, high = torch.aminmax(x.detach())
    if device_path(x):
        return torch.maximum(-low, high).double()  # maximum keeps a NaN
    low, high = low.item(), high.item()
    return math.nan if math.isnan(low) or math.isnan(high) else max(-low, high)


def _score_bound(q, k, scale: float) -> torch.Tensor | float:
    """A bound on |q k^T * scale| from two maxima: O(T D) beside attention's O(T^2 D); NaN or inf where q or k holds
    one. A 0-d float64 tensor on the device path, else a float; 0.0 where nothing is bounded."""
    return 0.0 if q.device.type == "meta" or not q.is_floating_point() or not q.numel() or not k.numel() else \
        _abs_max(q) * _abs_max(k) * q.shape[-1] * abs(scale)


def _scores_overflow(q, k, scale: float, bound=None) -> torch.Tensor | bool:
    """Whether q k^T * scale can overflow (in float32 at least: torch's kernel computes half precision scores in it),
    where the fused kernel returns 0 and the definition's softmax NaN: the definition runs instead. A 0-d bool tensor on
    q's device (False where nothing is bounded): the host path reads it (or assumes False where the plan speculates: q
    and k finite, their largest magnitude M with M^2 * D * |scale| under the limit), the device path selects."""
    limit, span = torch.finfo(torch.promote_types(q.dtype, torch.float32)).max, q.shape[-1] * abs(scale)
    if not device_path(q) and q.is_floating_point() and k.is_floating_point() and (assumed := _assumes(q, k)):
        if span:
            assumed.square = min(assumed.square, limit / span)
        return False
    return _not_below(_score_bound(q, k, scale) if bound is None else bound, limit)  # ``bound``: the caller's read


def _not_below(bound: torch.Tensor | float, limit: float) -> torch.Tensor | bool:
    """not bound < limit (NaN is not below), a bool for a float bound, else a bool tensor."""
    return not bound < limit if isinstance(bound, float) else ~(bound < limit)


def _torch_sdpa(q, k, v, attn_mask=None, **options):
    """torch's kernel (enable_gqa: k and v of fewer heads, ``ops.groups``); 3-D operands as 4-D ones of one head (the
    CPU flash kernel takes only 4-D ones: 3-D ones run the slower math fallback), 2-D ones as a batch of one."""
    if q.dim() == k.dim() == v.dim() == 2:
        return _torch_sdpa(q[None], k[None], v[None], attn_mask, **options)[0]
    gqa = ops.groups(q, k) * ops.groups(q, v) > 1 or q.dim() == k.dim() == v.dim() == 4 and \
        1 == k.shape[1] == v.shape[1] < q.shape[1]  # one k, v head (MQA): broadcast, torch's math path is 3x slower
    if q.dim() == k.dim() == v.dim() == 3 and not gqa:
        mask = attn_mask if attn_mask is None or attn_mask.dim() < 3 else attn_mask.unsqueeze(1)
        return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], attn_mask=mask, **options)[:, 0]
    if attn_mask is not None and 2 < attn_mask.dim() < q.dim():  # (H, T, S): fast 4-D, 3-D the math fallback
        attn_mask = attn_mask[(None,) * (q.dim() - attn_mask.dim())]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=gqa, **options)


def sdpa_masked(q, k, v, bias, scale):
    """softmax(q k^T * scale + bias) v, with an additive bias (-inf where masked). A row whose every key is masked is
    NaN, as that softmax is (torch's kernel returns 0 there). Only an overflowed or NaN score can tell a -inf bias from
    masked_fill, and those take the definition. The causal bias runs as ``is_causal``, skipping the masked blocks."""
    bias = torch.as_tensor(bias, device=q.device)  # a constant one may be a number: as the (T, S) mask torch takes
    bias = bias.expand(q.shape[-2], k.shape[-2]) if bias.dim() < 2 else bias
    if device_path(q):  # the guards on the device: the rows every key masks are NaN, and where the
        # scores can overflow the definition is selected (computed on every call: knowing it is not
        # needed would take a host read, as a causal flag would)
        bias = bias.to(q.dtype)
        dead = torch.isneginf(bias).all(-1, keepdim=True)
        out = _torch_sdpa(q, k, v, attn_mask=bias, scale=scale).masked_fill(dead, float("nan"))
        over = _scores_overflow(q, k, scale)
        return out if over is False else torch.where(over, ops.sdpa_masked(q, k, v, bias, scale), out)
    if _scores_overflow(q, k, scale):
        return ops.sdpa_masked(q, k, v, bias, scale)
    bias = bias.to(q.dtype) if bias.dtype == torch.bool else bias  # added: True is 1.0, not "keep"
    causal, dead, none = _mask_facts(bias, q.shape[-2], k.shape[-2])  # none: where it broadcasts to no more rows
    if causal or none and _into(bias.shape[:-2], q.shape[:-2]):
        return _torch_sdpa(q, k, v, is_causal=causal, scale=scale)
    out = _torch_sdpa(q, k, v, attn_mask=bias.to(q.dtype), scale=scale)
    return out if dead is None else out.masked_fill(dead, float("nan"))


def _into(small: torch.Size, big: torch.Size) -> bool:
    """Whether ``small`` broadcasts to ``big`` unchanged (``torch.broadcast_shapes``, 20 us a call, says it slower)."""
    return len(small) <= len(big) and all([n in (1, m) for n, m in zip(small[::-1], big[::-1])])


@functools.lru_cache(maxsize=8)
def _causal(queries: int, keys: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch's causal mask (``is_causal``: aligned top left), as a keep-mask or a bias (0 kept, -inf above; -0.0 = 0)."""
    return torch.ones(queries, keys, dtype=dtype, device=device).tril() if dtype == torch.bool else \
        torch.full((queries, keys), -math.inf, dtype=dtype, device=device).triu(1)


#: id(bias) -> (weak reference, what identifies its values, its facts); a few masks per program and size (a
#: generation's decode steps: one per size, a long generation's thousands)
_MASK_FACTS: dict[int, tuple] = {}


def _mask_facts(mask, queries: int, keys: int) -> tuple[bool, torch.Tensor | None, bool]:
    """(causal: a key above its query masked, every other kept, for every batch and head; the rows whose every key is
    masked, None where none is; none: all kept, 0 added: an encoder's mask of ones) of a -inf bias or a keep-mask. Read
    once per version: a mask buffer, or a bias folded from it, is the same tensor each call (inference ones: each)."""
    key = None if mask.is_inference() else \
        (mask.data_ptr(), mask._version, mask.shape, mask.stride(), mask.dtype, mask.device, queries, keys)
    seen = _MASK_FACTS.get(id(mask))
    if key is not None and seen is not None and seen[0]() is mask and seen[1] == key:
        return seen[2]
    square = mask.shape[-2:] == (queries, keys) and all(n == 1 for n in mask.shape[:-2])
    causal = square and queries > 1 and torch.equal(mask.reshape(queries, keys), _causal(queries, keys, mask.dtype,
                                                                                          mask.device))
    none = not causal and (bool(mask.all()) if mask.dtype == torch.bool else not bool(mask.any()))  # a NaN adds one
    keep = mask if mask.dtype == torch.bool or none or causal else ~torch.isneginf(mask)  # (none, causal: not read)
    dead = None if causal or none else ~keep.any(-1, keepdim=True)
    facts = causal, (dead if dead is not None and bool(dead.any()) else None), none
    if key is not None:
        if len(_MASK_FACTS) >= 4096:
            _MASK_FACTS.clear()
        _MASK_FACTS[id(mask)] = (weakref.ref(mask), key, facts)
    return facts


#: exp(x) is 0 in float32 (and narrower dtypes) below this: a key scoring this far under its row's max weighs exactly 0
EXP_UNDERFLOW = -104.0


def sdpa_filled(q, k, v, keep, scale, fill, bias=0.0):
    """softmax(where(keep, q k^T * scale + bias, fill)) v: GPT-2's mask, a finite ``fill`` (finfo.min) where ``keep``
    is False, and MPT's over scores with a bias (alibi). Where every score s + b has fill - (s + b) below
    EXP_UNDERFLOW, a masked key weighs exactly 0 in a row that keeps one, so torch's kernel runs with ``keep`` as its
    mask (or the bias, -inf where not kept); a row that keeps none is the softmax of a constant row: the mean of v.
    Elsewhere (scores or bias too large, a NaN, an infinite fill, a bias of another dtype) the definition runs."""
    definition, biased = functools.partial(ops.sdpa_filled, q, k, v, keep, scale, fill, bias), torch.is_tensor(bias)
    if not math.isfinite(fill) or biased and bias.dtype != q.dtype:
        return definition()
    bound = (scores := _score_bound(q, k, scale)) + (_abs_max(bias) if biased else 0.0)
    slow = _scores_overflow(q, k, scale, scores) | _not_below(bound, -fill + EXP_UNDERFLOW)
    mask = torch.where(keep, bias, -math.inf) if biased else keep
    if device_path(q) and not isinstance(slow, bool):  # the definition selected where needed,
        out = torch.where(~keep.any(-1, keepdim=True), ops.grouped(q, v.mean(-2, keepdim=True)),
                          _torch_sdpa(q, k, v, attn_mask=mask, scale=scale))  # on every call
        return torch.where(slow, definition(), out)
    if slow:
        return definition()
    causal, dead, none = _mask_facts(keep, q.shape[-2], k.shape[-2])
    if (causal or none and _into(keep.shape[:-2], q.shape[:-2])) and not biased:
        return _torch_sdpa(q, k, v, is_causal=causal, scale=scale)
    out = _torch_sdpa(q, k, v, attn_mask=mask, scale=scale)
    return out if dead is None else torch.where(dead, ops.grouped(q, v.mean(-2, keepdim=True)), out)


def sdpa_filled_then_biased(q, k, v, keep, bias, scale, fill):
    """softmax(where(keep, q k^T * scale, fill) + bias) v: torch's kernel over the mask where(keep, bias,
    fill + bias), which adds the scores s to fill + bias at a key not kept. Where every |s| is under a quarter
    of the ulp of each finite fill + bias (finfo.min's is 2^103), s + it rounds to it (an infinite one stays);
    elsewhere (a fill of the scores' size, a bias of another dtype, half-precision scores, which torch's
    kernel may add to the mask in float32, unrounded) the definition runs."""
    definition = functools.partial(OPS["sdpa_filled_then_biased"].impl, q, k, v, keep, bias, scale, fill)
    if q.dtype not in (torch.float32, torch.float64) or not torch.is_tensor(bias) or bias.dtype != q.dtype:
        return definition()
    filled = torch.tensor(fill, dtype=q.dtype, device=q.device) + bias  # small: a bias broadcast over rows
    mask, size = torch.where(keep, bias, filled), torch.where(filled.isfinite(), filled.abs(), math.inf).amin()
    slow = _not_below(_score_bound(q, k, scale), size.double() * torch.finfo(q.dtype).eps / 16)  # a tensor: selected
    live = not device_path(q) and bool((bias.isfinite() & filled.isfinite()).any(-1).all())  # no -inf row
    fast = functools.partial(_torch_sdpa if live else sdpa_masked, q, k, v, mask, scale=scale)
    return torch.where(slow, definition(), fast()) if torch.is_tensor(slow) else definition() if slow else fast()


def sdpa_floored(q, k, v, bias, scale, floor):
    """softmax(max(q k^T * scale + bias, floor)) v. Where every score s is under a quarter of floor's
    ulp (toward 0; no floor that q's dtype lacks), s + floor rounds to floor and s + b to at least that
    where b >= floor: the clamp is the bias's, s + max(b, floor), and torch's kernel runs, no key masked."""
    fi = torch.finfo(q.dtype)
    limit = fi.eps * 2.0 ** (math.frexp(floor)[1] - 4) if abs(floor) <= fi.max else 0.0
    slow = _not_below(_score_bound(q, k, scale), limit)  # a bool tensor on the device path: selected there
    definition = functools.partial(OPS["sdpa_floored"].impl, q, k, v, bias, scale, floor)
    fast = functools.partial(_torch_sdpa, q, k, v, attn_mask=bias.to(q.dtype).clamp(floor), scale=scale)
    return torch.where(slow, definition(), fast()) if torch.is_tensor(slow) else definition() if slow else fast()


def sdpa_guarded(q, k, v, bias, scale):
    """softmax(q k^T * scale + bias) v with the dynamo exporter's guard on the weights: each NaN weight is 0, so a row
    whose largest score is not finite (every key masked by -inf, an overflow to +inf, a NaN) gives 0. Where no score
    can overflow and v is finite, torch's kernel (0 for a row every -inf masks) is that; elsewhere the definition."""
    bias = bias.to(q.dtype)
    definition = functools.partial(ops.sdpa_guarded, q, k, v, bias, scale)
    if q.device.type == "meta":
        return definition()
    fast, over = ~(bias.isnan().any() | (bias == math.inf).any()) & v.isfinite().all(), _scores_overflow(q, k, scale)
    fast = fast & (~over if isinstance(over, torch.Tensor) else not over)
    if device_path(q):  # the definition selected where needed, computed on every call
        return torch.where(fast, _torch_sdpa(q, k, v, attn_mask=bias, scale=scale), definition())
    return _torch_sdpa(q, k, v, attn_mask=bias, scale=scale) if bool(fast) else definition()


def conv2d(x, weight, bias, stride, padding, dilation, groups):
    """A non-finite weight meets the zero padding (NaN * 0 is NaN): oneDNN's float32 kernel skips padded positions,
    where the half-precision and float64 kernels multiply them, so such a weight gets explicit padding (a weight is
    small: the check is cheap). On the device path every padded conv2d gets it: exact for a finite one too."""
    pad = parse_shape(padding)
    if any(pad) and weight.device.type != "meta" and (device_path(weight) or not all_finite(weight)):
        x, padding = F.pad(x, tuple(p for p in reversed(pad) for _ in range(2))), ",".join("0" * len(pad))
    return ops.conv2d(x, weight, bias, stride, padding, dilation, groups)


def sdpa(q, k, v, scale, causal):
    """Torch's kernel, and the definition for each attention (each leading index: batch, head) whose scores can
    overflow: one head's result never depends on another's values (attention split by heads computes each alone)."""
    out = _torch_sdpa(q, k, v, is_causal=causal, scale=scale)
    if q.device.type == "meta" or not q.numel() or not k.numel() or \
            not device_path(q) and not _scores_overflow(q, k, scale):
        return out  # on the device path the definition is selected per attention on every call
    limit = torch.finfo(torch.promote_types(q.dtype, torch.float32)).max
    bound = (q.abs().amax((-2, -1), keepdim=True).double() *  # k's per head, to q's heads
             ops.grouped(q, k.abs().amax((-2, -1), keepdim=True)).double() * q.shape[-1] * abs(scale))
    return torch.where(~(bound < limit), ops.sdpa(q, k, v, scale, causal), out)


def swish(x, beta):
    """x * sigmoid(beta x) (Swish; CLIP's quick gelu is beta = 1.702, silu beta = 1), as spelled;
    in place on beta x where autograd keeps no temporaries (one buffer, not three)."""
    return ops.swish(x, beta) if torch.is_grad_enabled() and x.requires_grad else (x * beta).sigmoid_().mul_(x)


def geglu(a, b, approximate):
    """gelu(a) * b: GeGLU's gate (Shazeer 2020), gelu's signed zeros kept; the product in place
    on gelu's output where autograd keeps it not and b is its like (the chunk's other half)."""
    out = gelu(a, approximate)
    return out.mul_(b) if isinstance(b, torch.Tensor) and b.shape == out.shape and b.dtype == out.dtype and \
        not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)) else out * b


@functools.lru_cache(maxsize=64)
def _half_signs(half: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """-1 over the first half of the last axis, +1 over the second: rotate_half's signs."""
    with torch.inference_mode(False):  # usable outside inference mode too
        return torch.tensor([-1, 1], dtype=dtype, device=device).repeat_interleave(half)


def rotary(x, cos, sin):
    """The reference's products exactly as roll(x) * (sin * signs), the signs on the smaller of sin and x; where
    autograd keeps no temporaries and ``sin`` neither widens nor broadcasts x, they run in place on the roll."""
    half, tensors = x.shape[-1] // 2, [t for t in (x, cos, sin) if isinstance(t, torch.Tensor)]
    if isinstance(sin, torch.Tensor) and x.shape[-1] == 2 * half and \
            not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) and \
            torch.promote_types(x.dtype, sin.dtype) == x.dtype and _into(sin.shape, x.shape):
        rotated, signs = torch.roll(x, half, -1), _half_signs(half, sin.dtype, sin.device)
        rotated.mul_(sin * signs) if sin.numel() < x.numel() else rotated.mul_(signs).mul_(sin)
        return (x * cos).add_(rotated)
    if isinstance(sin, torch.Tensor) and sin.shape[-1:] == x.shape[-1:] and sin.numel() < x.numel() \
            and x.shape[-1] == 2 * half:
        return x * cos + torch.roll(x, half, -1) * (sin * _half_signs(half, sin.dtype, sin.device))
    return ops.rotary(x, cos, sin)


def cross_entropy(x, target, reduction, ignore_index):
    """torch's own kernel (F.cross_entropy); where NaN (a row holding NaN or +inf, or no target kept), the reference."""
    if x.device.type != "meta" and device_path(x):  # torch's kernel is this composition: no check
        return ops.cross_entropy(x, target, reduction, ignore_index)
    out = F.cross_entropy(x, target, reduction=reduction, ignore_index=ignore_index)
    return out if x.device.type == "meta" or not bool(out.isnan().any()) else ops.cross_entropy(
        x, target, reduction, ignore_index)


#: torch's own call of an op, where the wrapper above adds a repair or a guard: a term that is the user's own call
#: (``Program.own``) runs it, as the original does (the wrapper keeps the op table's definition where a rewrite made
#: the op from other spellings)
PLAIN = {"gelu": lambda x, approximate: F.gelu(x, approximate=approximate), "softmax": torch.softmax,
         "log_softmax": torch.log_softmax, "linear": F.linear,
         "layer_norm": lambda x, weight, bias, eps: F.layer_norm(x, x.shape[-1:], weight, bias, eps)}
TORCH = {"softmax": softmax, "log_softmax": log_softmax, "gelu": gelu, "layer_norm": layer_norm,
         "rms_norm": rms_norm, "linear": linear, "linear_act": linear_act, "linear_add": linear_add,
         "linear_scaled": linear_scaled,
         "sdpa": sdpa, "sdpa_masked": sdpa_masked, "sdpa_filled": sdpa_filled, "sdpa_guarded": sdpa_guarded,
         "sdpa_floored": sdpa_floored, "sdpa_filled_biased": lambda q, k, v, keep, bias, scale, fill: sdpa_filled(
             q, k, v, keep, scale, fill, bias), "sdpa_filled_then_biased": sdpa_filled_then_biased,
         "conv2d": conv2d, "swish": swish, "geglu": geglu, "rotary": rotary, "cross_entropy": cross_entropy}
