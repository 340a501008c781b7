"""The op table: every op of the Term language, declared once.

An op has tensor operands (``arity``), attributes typed by egglog primitive sorts, a plain torch reference
implementation (on float64 tensors, the reference evaluator; a kernel's faster path lives with the kernels,
kernels/torch_ops.py), and facts whose kinds are the ``VOCABULARY``; composite ops (softmax, attention, ...) are checked
in the tests against their definitions in primitive ops. The egglog datatype is generated from this table."""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import Callable, Literal, get_args

import torch
import torch.nn.functional as F

from . import mesh

ATTR_SORTS = {"i64": int, "f64": float, "String": str, "bool": bool}

UNBOUNDED = (-math.inf, math.inf)
LINEAR = (0.0, 1.0)  #: curvature of an op that is linear (or piecewise linear) in each operand: (sup |f''|, sup |f'|)

# The vocabulary of the op table: the values each kind-valued fact may take. The stage named dispatches on it with a
# case for each (a test checks those tables against these); a row declaring any other value fails at import.
#: how its result's shape and dtype follow from its operands' (lang/term.py): "first" as the
#: first operand; "compare" a bool of the broadcast operands; "meta" by running it on meta tensors
ShapeRule = Literal["same", "first", "broadcast", "compare", "reduce", "cast", "transpose", "reshape",
                    "where", "matmul", "linear", "sdpa", "meta"]
#: how its interval follows from its operands' (analysis/ranges.py), unless it is an increasing float function's image
RangeRule = Literal[
    "abs", "add", "bounds", "copysign", "div", "geglu", "gelu", "hull", "hypot", "layer_norm", "linear",
    "linear_act", "log", "log1p", "log_softmax", "logaddexp", "logsumexp", "matmul", "maximum",
    "minimum", "mul", "neg", "operand", "pow", "rms_norm", "rotary", "rsqrt", "select", "silu",
    "softplus", "sqrt", "sub", "sum", "swish", "tan", "top", "values", "values-of-v", "var"]
#: a curvature formula over operand ranges (extractors/curvature.py)
Curvature = Literal["bilinear", "div", "exp", "layer_norm", "log", "log1p", "pow", "rsqrt", "sqrt", "swish"]
Sign = Literal["positive", "nonneg", "any"]  # an e-graph fact (egraph/range_rules.py)
#: how it amplifies its operands' rounding error (curvature.py): "exp" by |x|, "log" by 1/|log u|, "cancels" (a +- b),
#: "sum" (of both signs), "shifted-exp" (exp(x - max(x)) inside), "log-sum-exp" (and the log of its sum, near 1 where
#: one term dominates: logaddexp is not one, it adds log1p(exp(-|a - b|))), "rotation" (x cos + rotate_half(x) sin: a
#: sum of two rounded products, as cancels)
Error = Literal["none", "exp", "log", "cancels", "sum", "shifted-exp", "log-sum-exp", "rotation"]
Rounding = Literal["exact", "rounds", "widening"]  # exact from exact operands; widening: a cast
#: half precision (rulesets/precision.py): "accumulate" (many terms: float32), "hoist" (compute before rounding), "keep"
Precision = Literal["accumulate", "hoist", "keep"]
#: profiling kind (profiling/profiler.py); "static": priced by passes
Work = Literal["static", "pointwise", "select", "reduce", "along", "loss", "matmul", "linear",
               "layer_norm", "rms_norm", "sdpa"]
#: its result's memory layout (analysis/layouts.py): "fresh" (always contiguous), "view" (strides follow from the
#: operand's), "runs" (contiguous from contiguous operands, else as its kernel chooses: found by running it)
Layout = Literal["fresh", "view", "runs"]
#: a mesh op (lang/mesh.py) seeing every device's part: "parts" (each device holds its own) or "whole" (all the same)
MeshRole = Literal["parts", "whole"]
Growth = Literal[0, 1, 2, 3]  # class of kappa over unbounded ranges: 0 linear .. 3 exponential
VOCABULARY = {"shape_rule": ShapeRule, "range_rule": RangeRule, "curvature": Curvature, "sign": Sign,
              "error": Error, "rounding": Rounding, "precision": Precision, "work": Work,
              "layout": Layout, "mesh": MeshRole, "growth": Growth}


@dataclass(frozen=True)
class Op:
    """One op and every fact the stages derive from; a fact left None is undeclared (a test
    fails on a non-leaf op with one). Kind-valued facts take the values of their ``VOCABULARY``."""
    name: str
    arity: int
    attrs: tuple[tuple[str, str], ...]  # (name, egglog sort)
    impl: Callable | None  # reference implementation impl(*operands, *attrs); None for leaves
    infix: str | None = None
    shape_rule: ShapeRule | None = None
    range_rule: RangeRule | Callable | None = None
    bounds: tuple[float, float] | None = None  # every value it can take (UNBOUNDED: no such bound)
    sign: Sign | None = None
    curvature: tuple[float, float] | Curvature | None = None  # (sup |f''|, sup |f'|), or a formula
    growth: Growth | None = None
    error: Error | None = None
    rounding: Rounding | None = None
    passes: int | None = None  # passes over memory, when the profiling database has no estimate
    precision: Precision | None = None
    sample: tuple = ()  # operand shapes ("x0", ...) and attributes the precision rules' proofs sample
    work: Work | None = None
    flops: float | None = None  # FLOPs per element, for the per-element work kinds
    onnx: str | None = None  # ONNX form: an operator type, or a decomposition (backends/onnx_emitters.py)
    numpy: str | None = None  # the numpy function of a numpy kernel (kernels/registry.py), if any
    definition: str | None = None  # in primitive ops, a pattern over ?x0.. and its attributes: the
    # ONNX form "definition" writes it
    layout: Layout | None = None
    mesh: MeshRole | None = None  # None: an op that runs once per device on its own part

    def __post_init__(self):
        for fact, kinds in VOCABULARY.items():
            if isinstance(value := getattr(self, fact), (str, int)) and value not in get_args(kinds):
                raise ValueError(f"op {self.name!r}: {fact} = {value!r} is not one of {get_args(kinds)}")

    @property
    def egg_name(self) -> str:
        """CamelCase constructor name, clear of egglog's own primitives (max, exp on f64...)."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @property
    def is_leaf(self) -> bool:
        return self.arity == 0

    @property
    def attr_vars(self) -> str:
        """Its attributes as pattern variables, each after a space: `` ?axis ?keepdim``."""
        return "".join(f" ?{a}" for a, _ in self.attrs)

    @property
    def reference(self) -> str:
        """The op over pattern variables, ``(sum ?x0 ?axis ?keepdim)``: what its kernels compute."""
        return f"({self.name}{''.join(f' ?x{i}' for i in range(self.arity))}{self.attr_vars})"


def shape_attr(shape) -> str:
    """Shapes and permutations travel as egglog Strings: ``(2, 3)`` -> ``"2,3"``."""
    return ",".join(str(int(d)) for d in shape)


@functools.lru_cache(maxsize=4096)
def parse_shape(text: str) -> tuple[int, ...]:
    """Cached: a reshape, expand or permute kernel parses its attribute on every call (2 us)."""
    return tuple(int(d) for d in text.split(",")) if text else ()


def _tensor(x, like):
    return x if isinstance(x, torch.Tensor) else torch.full((), x, dtype=like.dtype, device=like.device)


def _of_tensors(fn: Callable) -> Callable:
    """``fn`` of two tensors taking either operand as a Python number (a const) too."""
    return lambda a, b: fn(_tensor(a, b), _tensor(b, a))


maximum, minimum, atan2, logaddexp, copysign = map(_of_tensors, (torch.maximum, torch.minimum, torch.atan2,
                                                                 torch.logaddexp, torch.copysign))
fmod, remainder = map(_of_tensors, (torch.fmod, torch.remainder))  # the sign of a (C's), of b (Python's)


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


def gelu(x, approximate):
    """x Phi(x): it has x's sign (some CPUs' kernels return +0 at -0 and where Phi(x) underflows),
    and above 8 it is x in every dtype (some give NaN at +inf)."""
    return torch.where(x > 8, x, F.gelu(x, approximate=approximate).copysign(x))


def hypot(a, b):
    """sqrt(a^2 + b^2) without overflow or underflow; NaN where an operand is (IEEE's hypot(inf, NaN) is inf)."""
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


def naive_at_posinf(x, axis, out, elsewhere: float):
    """Where a row holds +inf (and no NaN), what the naive quotient gives: NaN at each +inf and
    ``elsewhere`` (0 for softmax, -inf for its log) off it, where the max-shifted form alone is NaN
    across the row. So fusing the naive form is exact at +inf too. In ``out``'s layout."""
    if not x.is_floating_point() or not x.numel():
        return out
    rows = torch.amax(x, dim=axis, keepdim=True) == torch.inf  # not in a row with a NaN
    return out.masked_fill(rows, elsewhere).masked_fill_(rows & (x == torch.inf), torch.nan)


def softmax(x, axis):
    """exp(x) / sum(exp(x)), max-shifted ([inf, 1, 2] -> [nan, 0, 0], as the naive quotient)."""
    return naive_at_posinf(x, axis, torch.softmax(x, axis), 0.0)


def log_softmax(x, axis):
    """log(softmax(x)), max-shifted ([inf, 1, 2] -> [nan, -inf, -inf], as the naive form)."""
    return naive_at_posinf(x, axis, torch.log_softmax(x, axis), -torch.inf)


def layer_norm(x, weight, bias, eps):
    """Over the last axis; an affine-free spelling carries scalar consts as weight and bias."""
    if isinstance(weight, float) or isinstance(bias, float):
        return F.layer_norm(x, x.shape[-1:], eps=eps) * weight + bias
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def rms_norm(x, weight, eps):
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis (an affine-free spelling carries the scalar const 1.0 as
    weight), in the dtype of that product (shape kind "broadcast"). The mean of squares is a vector_norm accumulated
    in float32 at least: no x^2 tensor; squaring the norm overflows exactly where x^2's sum does."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.promote_types(x.dtype, torch.float32))
    out = x * torch.rsqrt(norm.square() / max(x.shape[-1], 1) + eps)
    out = out if isinstance(weight, float) and weight == 1.0 else out * weight
    dtype = x.dtype if isinstance(weight, float) else torch.promote_types(x.dtype, weight.dtype)
    return out if out.dtype == dtype else out.to(dtype)


#: linear_act's activation -> the op and attributes it applies
ACTIVATIONS = {"relu": ("relu", ()), "gelu": ("gelu", ("none",)), "gelu_tanh": ("gelu", ("tanh",))}


def linear_act(x, weight, bias, activation):
    op, attrs = ACTIVATIONS[activation]
    return OPS[op].impl(F.linear(x, weight, bias), *attrs)


def groups(q, x) -> int:
    """G where k or v (``x``) has fewer heads (axis -3) than q, a divisor: the attention ops read head
    h // G of x for q's head h, x's heads each repeated G times in a row (``grouped``) as
    transformers' repeat_kv and torch's enable_gqa repeat them (grouped-query attention); else 1."""
    h, hx = (q.shape[-3], x.shape[-3]) if min(q.dim(), x.dim()) >= 3 else (1, 1)
    return h // hx if 1 < hx < h and h % hx == 0 else 1


def grouped(q, x):
    return x if groups(q, x) == 1 else x.repeat_interleave(groups(q, x), -3)


def _attention(q, k, v, scale: float, bias=None):
    """The definition: softmax(q k^T * scale + bias) v, with softmax's own +inf semantics; a -inf
    bias masks its score outright, as masked_fill does (an overflowed score stays masked)."""
    scores = q @ grouped(q, k).transpose(-2, -1) * scale
    if bias is not None:
        scores = (scores + bias).masked_fill(torch.isneginf(bias), -math.inf)
    return softmax(scores, -1) @ grouped(q, v)


def sdpa(q, k, v, scale, causal):
    """softmax(q k^T * scale) v; ``causal``: each query's later keys masked."""
    bias = torch.full((q.shape[-2], k.shape[-2]), -torch.inf, dtype=q.dtype, device=q.device).triu(1) \
        if causal else None
    return _attention(q, k, v, scale, bias)


def sdpa_masked(q, k, v, bias, scale):
    """softmax(q k^T * scale + bias) v, an additive bias (-inf where masked; a bool one adds 1)."""
    return _attention(q, k, v, scale, torch.as_tensor(bias, device=q.device).to(q.dtype))  # a number too: a constant


def sdpa_filled(q, k, v, keep, scale, fill, bias=0.0):
    """softmax(where(keep, q k^T * scale + bias, fill)) v: GPT-2's mask, a finite ``fill`` (finfo.min);
    MPT's over scores with a bias (alibi) added (sdpa_filled_biased)."""
    return softmax(torch.where(keep, q @ grouped(q, k).transpose(-2, -1) * scale + bias, fill), -1) @ grouped(q, v)


def sdpa_guarded(q, k, v, bias, scale):
    """softmax(q k^T * scale + bias) v with the dynamo exporter's guard: each NaN weight is 0."""
    w = softmax(q @ grouped(q, k).transpose(-2, -1) * scale + bias.to(q.dtype), -1)
    return torch.where(w.isnan(), 0.0, w) @ grouped(q, v)


def conv2d(x, weight, bias, stride, padding, dilation, groups):
    y = F.conv2d(x, weight, None if isinstance(bias, float) else bias, parse_shape(stride),
                 parse_shape(padding), parse_shape(dilation), groups)
    return y + bias if isinstance(bias, float) else y


def swish(x, beta):
    """x * sigmoid(beta x) (Swish; CLIP's quick gelu is beta = 1.702, silu beta = 1)."""
    return x * torch.sigmoid(x * beta)


def rotary(x, cos, sin):
    """x cos + rotate_half(x) sin, rotate_half(x) = cat(-x2, x1) of the last axis' halves (Llama, GPT-NeoX)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def cross_entropy(x, target, reduction, ignore_index):
    """nll_loss(log_softmax(x, 1)), whose log_softmax keeps the naive quotient's value at +inf
    (+inf off the +inf logit, where torch's F.cross_entropy is NaN)."""
    return F.nll_loss(log_softmax(x, 1 if x.dim() > 1 else 0), target, reduction=reduction, ignore_index=ignore_index)


def sigmoid(v: float) -> float:
    """The logistic function on a float (the increasing function sigmoid's range is the image of)."""
    return 1 / (1 + math.exp(-v)) if v > -700 else 0.0


def _op(name, arity, attrs, impl, family: dict, **facts) -> Op:
    """An op from its family's facts, completed by its own; a lambda named for it (fx names a call from its source)."""
    if getattr(impl, "__name__", None) == "<lambda>":
        impl.__name__ = impl.__qualname__ = name
    pairs = tuple(tuple(a.split(":")) for a in attrs.split()) if attrs else ()
    return Op(name, arity, pairs, impl, **{**family, **facts})


_AXIS, _REDUCE = "axis:i64", "axis:i64 keepdim:bool"
_WINDOW = "stride:String padding:String dilation:String"  # per spatial dim, as shape_attr strings

# facts shared by a family of ops; a row completes them and may override them
_ANY = dict(bounds=UNBOUNDED, sign="any", error="none", layout="fresh")
_LEAF = dict(_ANY, curvature=LINEAR, growth=0, rounding="exact", passes=0, precision="keep")
_BINARY = dict(_ANY, shape_rule="broadcast", rounding="rounds", passes=2, precision="hoist",
               work="pointwise", flops=1, layout="runs")
_UNARY = dict(_ANY, shape_rule="same", rounding="rounds", passes=2, precision="hoist", work="pointwise",
              flops=10, layout="runs")
_REDUCTION = dict(_ANY, shape_rule="reduce", curvature=LINEAR, growth=0, rounding="rounds", passes=4,
                  precision="accumulate", work="reduce", flops=1)
_LAYOUT = dict(_ANY, shape_rule="meta", range_rule="values", curvature=LINEAR, growth=0, rounding="exact",
               passes=1, precision="hoist", work="static", layout="view")
_FUSED = dict(_ANY, rounding="rounds", precision="accumulate", work="static", layout="runs")
#: mesh ops: shapes on one device by running them on meta tensors; priced by sharding/cost.py
_MESH = dict(_ANY, shape_rule="meta", curvature=LINEAR, growth=0, precision="keep", work="static",
             onnx="none", mesh="parts")
_SMOOTH = dict(growth=1)  # bounded curvature
_ATTENTION = dict(_FUSED, shape_rule="sdpa", range_rule="values-of-v", curvature=(1.0, 1.0), **_SMOOTH, work="sdpa")
_STEEP = dict(curvature=(math.inf, math.inf), growth=2)  # unbounded curvature
_EXPS = dict(curvature="exp", growth=3, error="exp")  # exponential growth
_LOGS = dict(curvature="log", growth=2, error="log")
_EXACT = dict(curvature=LINEAR, growth=0, rounding="exact")  # piecewise linear, no rounding
_STEP = dict(_UNARY, **_EXACT, flops=1, precision="keep")  # to an integer, exactly
_MASK = dict(shape_rule="compare", range_rule="bounds", bounds=(0.0, 1.0), sign="nonneg", **_EXACT, precision="keep")
_ARG = dict(_REDUCTION, shape_rule="meta", range_rule="top", rounding="exact", precision="keep", work="static")
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
    _op("add", 2, "", operator.add, _BINARY, infix="+", range_rule="add", curvature=LINEAR, growth=0,
        error="cancels", onnx="Add"),
    _op("sub", 2, "", operator.sub, _BINARY, infix="-", range_rule="sub", curvature=LINEAR, growth=0,
        error="cancels", onnx="Sub"),
    _op("mul", 2, "", operator.mul, _BINARY, infix="*", range_rule="mul", curvature="bilinear", growth=1, onnx="Mul"),
    _op("div", 2, "", operator.truediv, _BINARY, infix="/", range_rule="div", curvature="div", growth=2, onnx="Div"),
    _op("pow", 2, "", operator.pow, _BINARY, infix="**", range_rule="pow", curvature="pow", growth=2,
        precision="keep", flops=10, onnx="Pow"),
    _op("maximum", 2, "", maximum, _BINARY, range_rule="maximum", **_EXACT, onnx="Max"),
    _op("minimum", 2, "", minimum, _BINARY, range_rule="minimum", **_EXACT, onnx="Min"),
    _op("where", 3, "", torch.where, _BINARY, shape_rule="where", range_rule="select", **_EXACT, precision="keep",
        work="select", onnx="Where"),
    # masks (bools): the condition of a piecewise program (extractors/regimes.py); isnan is the dynamo
    # exporter's softmax guard (sdpa_guarded), logical_not the keys masked_fill(mask, fill) keeps (sdpa_filled)
    _op("less", 2, "", operator.lt, _BINARY, infix="<", **_MASK, onnx="Less"),
    _op("isnan", 1, "", torch.isnan, _UNARY, **_MASK, flops=1, onnx="IsNaN"),
    _op("logical_not", 1, "", torch.logical_not, _UNARY, **_MASK, flops=1, onnx="Not"),
    _op("neg",     1, "", operator.neg, _UNARY, range_rule="neg",     **_EXACT, flops=1, onnx="Neg", numpy="negative"),
    _op("exp",     1, "", torch.exp,    _UNARY, range_rule=math.exp, **_EXPS, sign="positive", onnx="Exp", numpy="exp"),
    _op("log",     1, "", torch.log,    _UNARY, range_rule="log",     **_LOGS, onnx="Log", numpy="log"),
    _op("log1p",   1, "", torch.log1p,  _UNARY, range_rule="log1p",   curvature="log1p", growth=2,
        onnx="kahan-log1p", numpy="log1p"),
    _op("expm1",   1, "", torch.expm1,  _UNARY, range_rule=math.expm1, **_EXPS, onnx="kahan-expm1", numpy="expm1"),
    _op("sqrt",    1, "", torch.sqrt,   _UNARY, range_rule="sqrt",    curvature="sqrt",  growth=2,
        sign="nonneg", onnx="Sqrt", numpy="sqrt"),
    _op("rsqrt",   1, "", torch.rsqrt,  _UNARY, range_rule="rsqrt",   curvature="rsqrt", growth=2,
        onnx="definition", definition="(div (const 1.0) (sqrt ?x0))"),
    _op("abs",     1, "", torch.abs,    _UNARY, range_rule="abs",     **_EXACT, sign="nonneg", flops=1,
        onnx="Abs", numpy="abs"),
    # |a| with b's sign bit (-0.0's and NaN's too): libm's and Rust's odd functions are spelled with it
    _op("copysign", 2, "", copysign,    _BINARY, range_rule="copysign", **_EXACT, flops=1, precision="keep",
        onnx="none"),
    _op("sin",     1, "", torch.sin,    _UNARY, range_rule="bounds",  curvature=(1.0, 1.0), **_SMOOTH,
        bounds=(-1.0, 1.0), onnx="Sin", numpy="sin"),
    _op("cos",     1, "", torch.cos,    _UNARY, range_rule="bounds",  curvature=(1.0, 1.0), **_SMOOTH,
        bounds=(-1.0, 1.0), onnx="Cos", numpy="cos"),
    _op("tanh",    1, "", torch.tanh,   _UNARY, range_rule=math.tanh, curvature=(0.77, 1.0), **_SMOOTH,
        bounds=(-1.0, 1.0), onnx="Tanh", numpy="tanh"),
    _op("sigmoid", 1, "", torch.sigmoid, _UNARY, range_rule=sigmoid,  curvature=(0.097, 0.25), **_SMOOTH,
        bounds=(0.0, 1.0), sign="positive", onnx="Sigmoid"),
    _op("relu",    1, "", torch.relu,   _UNARY, range_rule=functools.partial(max, 0.0), **_EXACT,
        sign="nonneg", flops=1, onnx="Relu"),
    _op("erf",     1, "", torch.erf,    _UNARY, range_rule=math.erf,  curvature=(0.97, 1.0), **_SMOOTH, onnx="Erf"),
    _op("silu",    1, "", F.silu,       _UNARY, range_rule="silu",    curvature=(0.5, 1.1), **_SMOOTH,
        onnx="definition", definition="(mul ?x0 (sigmoid ?x0))"),  # x * sigmoid(x), one pass
    _op("gelu",    1, "approximate:String", gelu, _UNARY, range_rule="gelu", curvature=(0.8, 1.0),
        **_SMOOTH, sample=(("approximate", "tanh"),), onnx="Gelu"),
    _op("swish",   1, "beta:f64", swish, _UNARY, range_rule="swish", curvature="swish", **_SMOOTH,
        flops=12, sample=(("beta", 1.702),), onnx="definition",
        definition="(mul ?x0 (sigmoid (mul ?x0 (const ?beta))))"),  # quick gelu, one op
    # trigonometric, hyperbolic and root functions (issue 16): the forms cancellation rules reach.
    # Bounds are float32's roundings of pi/2 and pi, outward (atan(inf) is 1.5707964 > pi/2)
    _op("tan",     1, "", torch.tan,    _UNARY, range_rule="tan",     **_STEEP, onnx="Tan"),
    _op("atan",    1, "", torch.atan,   _UNARY, range_rule=math.atan, curvature=(0.65, 1.0), **_SMOOTH,
        bounds=(-1.5708, 1.5708), onnx="Atan"),
    _op("atan2",   2, "", atan2,        _BINARY, range_rule="bounds", curvature="div", growth=2,
        bounds=(-3.1416, 3.1416), flops=20, precision="keep", onnx="quadrant-atan"),
    _op("hypot",   2, "", hypot,        _BINARY, range_rule="hypot",  curvature=(1.0, 1.0), **_SMOOTH,
        sign="nonneg", flops=10, precision="keep", onnx="definition",
        definition="(sqrt (add (mul ?x0 ?x0) (mul ?x1 ?x1)))"),
    _op("cbrt",    1, "", cbrt,         _UNARY, range_rule=cube_root, curvature="sqrt", growth=2,
        onnx="signed-cube-root"),
    _op("asinh",   1, "", torch.asinh,  _UNARY, range_rule=math.asinh, curvature=(0.39, 1.0), **_SMOOTH, onnx="Asinh"),
    _op("acosh",   1, "", torch.acosh,  _UNARY, range_rule=math.acosh, **_STEEP, onnx="Acosh"),
    _op("atanh",   1, "", torch.atanh,  _UNARY, range_rule=math.atanh, **_STEEP, onnx="Atanh"),
    # reductions over one axis (axes are canonical: negative, counted from the end)
    _op("sum", 1, _REDUCE, torch.sum, _REDUCTION, range_rule="sum", error="sum", onnx="ReduceSum"),
    _op("compensated_sum", 1, _REDUCE, compensated_sum, _REDUCTION, range_rule="sum", passes=12, flops=8,
        onnx="float64-sum"),
    _op("max", 1, _REDUCE, torch.amax, _REDUCTION, range_rule="operand", rounding="exact",
        precision="keep", onnx="ReduceMax"),
    _op("mean", 1, _REDUCE, torch.mean, _REDUCTION, range_rule="operand", onnx="ReduceMean"),
    _op("prod", 1, _REDUCE, torch.prod, _REDUCTION, range_rule="top", **_STEEP, onnx="none"),  # core ATen's
    # the index of the largest (smallest) element along an axis: an int64 tensor, not a value of x
    _op("argmax", 1, _REDUCE, torch.argmax, _ARG, onnx="none"),
    _op("argmin", 1, _REDUCE, torch.argmin, _ARG, onnx="none"),
    _op("var", 1, _REDUCE + " correction:i64",
        lambda x, axis, keepdim, correction: torch.var(x, dim=axis, keepdim=keepdim, correction=correction),
        _REDUCTION, range_rule="var", sign="nonneg", curvature=(2.0, 1.0), growth=1, passes=6, flops=3,
        onnx="mean-of-squares"),
    # linear algebra and layout
    _op("matmul", 2, "", operator.matmul, _FUSED, infix="@", shape_rule="matmul", range_rule="matmul",
        curvature="bilinear", growth=1, passes=16, sample=(("x0", (3, 5)), ("x1", (5, 4))),
        work="matmul", onnx="MatMul", layout="fresh"),
    _op("transpose", 1, "dim0:i64 dim1:i64", torch.transpose, _LAYOUT, shape_rule="transpose", onnx="Transpose"),
    _op("permute", 1, "perm:String", lambda x, perm: x.permute(parse_shape(perm)), _LAYOUT,
        sample=(("perm", "0,2,3,1"),), onnx="Transpose"),
    _op("reshape", 1, "shape:String", lambda x, shape: x.reshape(parse_shape(shape)), _LAYOUT,
        shape_rule="reshape", sample=(("shape", "6,25"),), onnx="Reshape"),
    _op("expand", 1, "shape:String", lambda x, shape: x.expand(parse_shape(shape)), _LAYOUT,
        shape_rule="reshape", sample=(("x0", (2, 3, 1, 5)), ("shape", "2,3,4,5")), onnx="Expand"),
    _op("gather", 2, _AXIS, lambda x, index, axis: torch.gather(x, axis, index), _LAYOUT,
        range_rule="operand", passes=2, precision="keep", onnx="GatherElements", layout="fresh"),
    _op("index_select", 2, _AXIS, lambda x, index, axis: torch.index_select(x, axis, index), _LAYOUT,
        range_rule="operand", passes=2, precision="keep", onnx="Gather", layout="fresh"),
    _op("slice", 1, "axis:i64 start:i64 end:i64 step:i64",
        lambda x, axis, start, end, step: x[(slice(None),) * (x.dim() + axis) + (slice(start, end, step),)],
        _LAYOUT, range_rule="operand", sample=(("axis", -1), ("start", 1), ("end", 4), ("step", 2)),
        onnx="Slice"),
    _op("concat", 2, _AXIS, lambda a, b, axis: torch.cat([a, b], dim=axis), _LAYOUT, range_rule="hull",
        passes=2, precision="keep", onnx="Concat", layout="fresh"),
    _op("cast", 1, "dtype:String", lambda x, dtype: x.to(getattr(torch, dtype)), _LAYOUT, shape_rule="cast",
        rounding="widening", passes=2, precision="keep", onnx="Cast", layout="runs"),
    # composites: each has a definition in primitives (checked in tests) and stable kernels
    _op("softmax", 1, _AXIS, softmax, _FUSED, shape_rule="same", range_rule="bounds", bounds=(0.0, 1.0),
        sign="nonneg", curvature=(1.0, 1.0), **_SMOOTH, error="shifted-exp", passes=5,
        work="along", flops=12, onnx="Softmax"),
    _op("log_softmax", 1, _AXIS, log_softmax, _FUSED, shape_rule="same", range_rule="log_softmax",
        curvature=(0.5, 1.0), **_SMOOTH, error="log-sum-exp", passes=5, work="along", flops=12,
        onnx="LogSoftmax"),
    _op("logsumexp", 1, _REDUCE, torch.logsumexp, _FUSED, shape_rule="reduce", range_rule="logsumexp",
        curvature=(0.5, 1.0), **_SMOOTH, error="log-sum-exp", passes=5, work="reduce", flops=12,
        onnx="ReduceLogSumExp", layout="fresh"),
    _op("softplus", 1, "", lambda x: torch.logaddexp(x, torch.zeros_like(x)), _UNARY,  # log(1 + e^x),
        range_rule="softplus", curvature=(0.25, 1.0), **_SMOOTH,  # exactly: no threshold approximation
        work="static", onnx="Softplus"),
    _op("logaddexp", 2, "", logaddexp, _BINARY, range_rule="logaddexp", curvature=(0.25, 1.0),
        **_SMOOTH, precision="keep", work="static", onnx="stable-logaddexp"),
    _op("layer_norm", 3, "eps:f64", layer_norm, _FUSED, shape_rule="first", range_rule="layer_norm",
        curvature="layer_norm", growth=2, passes=6,
        sample=(("x0", (3, 5)), ("x1", (5,)), ("x2", (5,)), ("eps", 1e-5)), work="layer_norm",
        onnx="LayerNormalization"),
    _op("rms_norm", 2, "eps:f64", rms_norm, _FUSED, shape_rule="broadcast", range_rule="rms_norm",
        curvature="layer_norm", growth=2, passes=4, precision="keep",  # accumulates in float32 itself
        sample=(("x0", (3, 5)), ("x1", (5,)), ("eps", 1e-6)), work="rms_norm",
        onnx="RMSNormalization"),
    _op("sdpa", 3, "scale:f64 causal:bool", sdpa, _ATTENTION, passes=20,
        sample=(*_ATTENTION_SAMPLE, ("scale", 0.5), ("causal", False)), onnx="Attention"),
    _op("geglu", 2, "approximate:String", lambda a, b, approximate: gelu(a, approximate) * b, _FUSED,
        shape_rule="broadcast", range_rule="geglu", curvature="bilinear", growth=1, passes=3, precision="keep",
        onnx="definition",
        definition="(mul (gelu ?x0 ?approximate) ?x1)"),
    _op("rotary", 3, "", rotary, _FUSED, shape_rule="broadcast", range_rule="rotary", curvature="bilinear",
        growth=1, error="rotation", passes=5, precision="keep", onnx="rotate-half"),
    # losses over class indices (class axis 1); targets equal to ignore_index count for nothing ("mean" over none: NaN)
    _op("nll_loss", 2, "reduction:String ignore_index:i64", lambda x, target, reduction, ignore_index:
        F.nll_loss(x, target, reduction=reduction, ignore_index=ignore_index), _FUSED, shape_rule="meta",
        range_rule="top", curvature=LINEAR, growth=0, error="sum", passes=1, precision="keep",
        onnx="NegativeLogLikelihoodLoss"),
    _op("cross_entropy", 2, "reduction:String ignore_index:i64", cross_entropy, _FUSED,
        shape_rule="meta", range_rule="top", sign="nonneg", curvature=(0.5, 1.0), **_SMOOTH,
        error="log-sum-exp", passes=3, precision="keep", work="loss", flops=12,
        onnx="SoftmaxCrossEntropyLoss"),
    _op("linear", 3, "", F.linear, _FUSED, shape_rule="linear", range_rule="linear", curvature="bilinear",
        growth=1, passes=17, sample=_MATMUL_SAMPLE, work="linear", onnx="Gemm", layout="fresh"),
    _op("linear_act", 3, "activation:String", linear_act, _FUSED, shape_rule="linear",
        range_rule="linear_act", curvature=(1.0, 1.0), **_SMOOTH, passes=17,
        sample=(*_MATMUL_SAMPLE, ("activation", "gelu_tanh")), work="linear",
        onnx="linear-activation", layout="fresh"),
    _op("linear_add", 4, "", lambda x, w, b, r: F.linear(x, w, b) + r, _FUSED, shape_rule="meta",
        range_rule="linear", curvature="bilinear", growth=1, passes=18, sample=(*_MATMUL_SAMPLE, ("x3", (3, 4))),
        work="linear", onnx="definition", definition="(add (linear ?x0 ?x1 ?x2) ?x3)", layout="fresh"),
    _op("linear_scaled", 3, "scale:f64", lambda x, w, b, scale: F.linear(x, w, b) * scale, _FUSED,
        shape_rule="linear", range_rule="top", curvature="bilinear", growth=1, passes=17,
        sample=(*_MATMUL_SAMPLE, ("scale", 0.5)), work="linear", onnx="definition",
        definition="(mul (linear ?x0 ?x1 ?x2) (const ?scale))", layout="fresh"),
    _op("sdpa_masked", 4, "scale:f64", sdpa_masked, _ATTENTION, passes=21,
        sample=(*_ATTENTION_SAMPLE, ("x3", (4, 5)), ("scale", 0.5)), onnx="Attention"),
    _op("sdpa_filled", 4, "scale:f64 fill:f64", sdpa_filled, _ATTENTION, passes=21, precision="keep",  # a
        # boolean operand: no float32 copy of it; torch's kernel accumulates in float32 itself
        onnx="definition", definition="(matmul (softmax (where ?x3 (mul (matmul ?x0 (transpose ?x1 "
        "-2 -1)) (const ?scale)) (const ?fill)) -1) ?x2)"),
    _op("sdpa_filled_biased", 5, "scale:f64 fill:f64", lambda q, k, v, keep, bias, scale, fill: sdpa_filled(
        q, k, v, keep, scale, fill, bias), _ATTENTION, passes=22, precision="keep", onnx="definition",
        definition="(matmul (softmax (where ?x3 (add (mul (matmul ?x0 (transpose ?x1 -2 -1)) (const ?scale)) ?x4) "
        "(const ?fill)) -1) ?x2)"),
    _op("sdpa_filled_then_biased", 5, "scale:f64 fill:f64", lambda q, k, v, keep, bias, scale, fill: softmax(
        torch.where(keep, q @ grouped(q, k).transpose(-2, -1) * scale, fill) + bias, -1) @ grouped(q, v), _ATTENTION,
        passes=22, precision="keep",
        onnx="definition", definition="(matmul (softmax (add (where ?x3 (mul (matmul ?x0 (transpose ?x1 -2 -1)) "
        "(const ?scale)) (const ?fill)) ?x4) -1) ?x2)"),  # GPT-NeoX: the mask added after the fill
    _op("sdpa_floored", 4, "scale:f64 floor:f64", lambda q, k, v, bias, scale, floor: softmax((q @ grouped(
        q, k).transpose(-2, -1) * scale + bias.to(q.dtype)).clamp(floor), -1) @ grouped(q, v), _ATTENTION,
        passes=21,  # OPT's clamp
        onnx="definition", definition="(matmul (softmax (maximum (add (mul (matmul ?x0 (transpose ?x1 -2 -1)) "
        "(const ?scale)) ?x3) (const ?floor)) -1) ?x2)"),
    _op("sdpa_guarded", 4, "scale:f64", sdpa_guarded, _ATTENTION, passes=21,
        sample=(*_ATTENTION_SAMPLE, ("x3", (4, 5)), ("scale", 0.5)), onnx="Attention",
        definition=f"(matmul (where (isnan {_GUARDED}) (const 0.0) {_GUARDED}) ?x2)"),
    _op("conv2d", 3, _WINDOW + " groups:i64", conv2d, _FUSED, shape_rule="meta", range_rule="linear",
        curvature="bilinear", growth=1, passes=24,
        sample=(("x0", (2, 3, 6, 6)), ("x1", (4, 3, 3, 3)), ("x2", (4,)), ("stride", "1,1"),
                ("padding", "1,1"), ("dilation", "1,1"), ("groups", 1)), onnx="Conv", layout="fresh"),
    _op("max_pool2d", 1, "kernel:String " + _WINDOW,  # padded by -inf: a window's max is one of x's values
        lambda x, *sizes: F.max_pool2d(x, *map(parse_shape, sizes)), _LAYOUT, range_rule="operand",
        passes=2, sample=(("x0", (2, 3, 6, 6)), ("kernel", "2,2"), ("stride", "2,2"),
                          ("padding", "0,0"), ("dilation", "1,1")), onnx="MaxPool", layout="fresh"),
    _op("batch_norm", 5, "eps:f64", lambda x, mean, var, weight, bias, eps:  # inference: running statistics
        F.batch_norm(x, mean, var, weight, bias, False, 0.0, eps), _FUSED, shape_rule="first", range_rule="top",
        curvature=LINEAR, growth=0, passes=6, precision="keep", onnx="BatchNormalization"),
    # ---- sharding: place and move values over a mesh of n devices (lang/mesh.py; rulesets/sharding.py)
    _op("shard", 1, "axis:i64 n:i64", mesh.shard, _MESH, range_rule="operand", rounding="exact", passes=1),
    _op("all_gather", 1, "axis:i64 n:i64", mesh.all_gather, _MESH, range_rule="values", rounding="exact",
        passes=2, mesh="whole"),
    _op("all_reduce", 1, "n:i64", mesh.all_reduce, _MESH, range_rule="top", rounding="rounds", error="sum",
        passes=2, mesh="whole"),
    _op("reduce_scatter", 1, "axis:i64 n:i64", mesh.reduce_scatter, _MESH, range_rule="top",
        rounding="rounds", error="sum", passes=2),
    # ---- the rest of the Core ATen opset's elementwise math (lowered as torch's functions of their names)
    _op("floor",   1, "", torch.floor,  _STEP, range_rule=math.floor, onnx="Floor"),
    _op("ceil",    1, "", torch.ceil,   _STEP, range_rule=math.ceil,  onnx="Ceil"),
    _op("round",   1, "", torch.round,  _STEP, range_rule=round,      onnx="Round"),  # half to even
    _op("trunc",   1, "", torch.trunc,  _STEP, range_rule=math.trunc, onnx="none"),
    _op("asin",    1, "", torch.asin,   _UNARY, range_rule="bounds",  **_STEEP, bounds=(-1.5708, 1.5708), onnx="Asin"),
    _op("acos",    1, "", torch.acos,   _UNARY, range_rule="bounds",  **_STEEP, bounds=(0.0, 3.1416), sign="nonneg",
        onnx="Acos"),
    _op("sinh",    1, "", torch.sinh,   _UNARY, range_rule=math.sinh, **_EXPS, onnx="Sinh", numpy="sinh"),
    _op("cosh",    1, "", torch.cosh,   _UNARY, range_rule="bounds",  **_EXPS, bounds=(1.0, math.inf), sign="positive",
        onnx="Cosh", numpy="cosh"),
    _op("log2",    1, "", torch.log2,   _UNARY, range_rule=math.log2, **_LOGS, onnx="none"),
    _op("log10",   1, "", torch.log10,  _UNARY, range_rule=math.log10, **_LOGS, onnx="none"),
    _op("fmod",    2, "", fmod,         _BINARY, range_rule="top",    **_STEEP, precision="keep", onnx="none"),
    _op("remainder", 2, "", remainder,  _BINARY, range_rule="top",    **_STEEP, precision="keep", onnx="none")]}

BY_EGG_NAME = {op.egg_name: op for op in OPS.values()}


def ops_where(fact) -> tuple[str, ...]:
    """The names of the non-leaf ops for which ``fact(op)`` holds, in table order."""
    return tuple(name for name, op in OPS.items() if not op.is_leaf and fact(op))


# Categories the stages select ops by (names, in table order)
#: a + b and its like: two operands broadcast, no attribute (rms_norm reduces along its last axis)
BINARY_ELEMENTWISE = ops_where(lambda op: op.shape_rule == "broadcast" and op.arity == 2 and not op.attrs)
#: two operands broadcast to the result's shape and promote to its dtype (rms_norm and geglu too)
BINARY_BROADCASTING = ops_where(lambda op: op.shape_rule == "broadcast" and op.arity == 2)
#: exp(x) and its like: one operand, element to element (softmax works along an axis)
UNARY_ELEMENTWISE = ops_where(lambda op: op.shape_rule == "same" and op.arity == 1 and "axis" not in dict(op.attrs))
COMPARISONS = ops_where(lambda op: op.shape_rule == "compare")  # a bool mask
#: along one axis, which is dropped or kept as 1 (sum, max, mean, var, logsumexp, ...)
REDUCTIONS = ops_where(lambda op: op.shape_rule == "reduce")
ELEMENTWISE = UNARY_ELEMENTWISE + BINARY_ELEMENTWISE + COMPARISONS + ("where",)
#: results of the operand's shape (its last dim and rank, whatever their dtype)
SAME_SHAPE = ops_where(lambda op: op.shape_rule in ("same", "cast"))
