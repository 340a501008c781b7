"""The op table: every op of the Term language, declared once.

An op has tensor operands (``arity``), attributes typed by egglog primitive sorts, and one torch
implementation. The same implementation runs the optimized program and, on float64 tensors, is the
reference evaluator; composite ops (softmax, attention, ...) are checked in the tests against their
definitions in primitive ops. The egglog datatype is generated from this table.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

ATTR_SORTS = {"i64": int, "f64": float, "String": str, "bool": bool}


@dataclass(frozen=True)
class Op:
    name: str
    arity: int
    attrs: tuple[tuple[str, str], ...]  # (name, egglog sort)
    impl: Callable | None  # torch implementation impl(*operands, *attrs); None for leaves
    infix: str | None = None

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


def parse_shape(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split(",")) if text else ()


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
    if not v.is_floating_point() or v.shape[-1] == 0:
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
    return F.gelu(x, approximate=approximate)


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


def softmax(x, axis):
    """exp(x) / sum(exp(x)), max-shifted. A row holding +inf (and no NaN) gives what the naive
    quotient gives, NaN at each +inf and 0 elsewhere ([inf, 1, 2] -> [nan, 0, 0]), where the
    shifted form alone is NaN across the row: so fusing the naive quotient into this op is exact
    at +inf, and a fused program agrees with the one it replaced (one ``where``, no extra pass)."""
    out = torch.softmax(x, axis)
    if not x.is_floating_point():
        return out
    top = torch.amax(x, dim=axis, keepdim=True)  # NaN in a row with a NaN: the row stays NaN
    naive = torch.where(x == torch.inf, torch.nan, 0.0).to(out.dtype)
    return torch.where(top == torch.inf, naive, out)


def log_softmax(x, axis):
    return torch.log_softmax(x, axis)


def cast(x, dtype):
    return x.to(getattr(torch, dtype))


def logsumexp(x, axis, keepdim):
    return torch.logsumexp(x, dim=axis, keepdim=keepdim)


def layer_norm(x, weight, bias, eps):
    """Over the last axis; an affine-free spelling carries scalar consts as weight and bias."""
    if not isinstance(weight, float) and not isinstance(bias, float):  # tensors (or None)
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    return F.layer_norm(x, x.shape[-1:], None, None, eps) * weight + bias


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}


def linear_act(x, weight, bias, activation):
    return ACTIVATIONS[activation](F.linear(x, weight, bias))


def sdpa_masked(q, k, v, bias, scale):
    """softmax(q k^T * scale + bias) v, with an additive bias (-inf where masked). A row whose
    every key is masked is NaN, as that softmax is (torch's kernel returns 0 there)."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=scale)
    dead = torch.isneginf(bias).all(-1, keepdim=True)
    return out.masked_fill(dead, float("nan"))


def conv2d(x, weight, bias, stride, padding, dilation, groups):
    y = F.conv2d(x, weight, None if isinstance(bias, float) else bias, parse_shape(stride),
                 parse_shape(padding), parse_shape(dilation), groups)
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
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def rsqrt(x):
    return torch.rsqrt(x)


def _op(name, arity, attrs="", impl=None, infix=None) -> Op:
    pairs = tuple(tuple(a.split(":")) for a in attrs.split()) if attrs else ()
    return Op(name, arity, pairs, impl, infix)


_AXIS = "axis:i64"
_REDUCE = "axis:i64 keepdim:bool"
_WINDOW = "stride:String padding:String dilation:String"  # per spatial dim, as shape_attr strings

OPS: dict[str, Op] = {op.name: op for op in [
    # leaves: program inputs, parameters (by name), scalar constants, opaque calls (by node name)
    _op("input", 0, "name:String shape:String dtype:String"),
    _op("param", 0, "name:String shape:String dtype:String"),
    _op("const", 0, "value:f64"),
    _op("opaque", 0, "name:String"),
    # elementwise, broadcasting
    _op("add", 2, impl=operator.add, infix="+"),
    _op("sub", 2, impl=operator.sub, infix="-"),
    _op("mul", 2, impl=operator.mul, infix="*"),
    _op("div", 2, impl=operator.truediv, infix="/"),
    _op("pow", 2, impl=operator.pow, infix="**"),
    _op("maximum", 2, impl=maximum),
    _op("minimum", 2, impl=minimum),
    _op("where", 3, impl=where),
    _op("neg", 1, impl=operator.neg),
    _op("exp", 1, impl=torch.exp),
    _op("log", 1, impl=torch.log),
    _op("log1p", 1, impl=torch.log1p),
    _op("expm1", 1, impl=torch.expm1),
    _op("sqrt", 1, impl=torch.sqrt),
    _op("rsqrt", 1, impl=rsqrt),
    _op("abs", 1, impl=torch.abs),
    _op("sin", 1, impl=torch.sin),
    _op("cos", 1, impl=torch.cos),
    _op("tanh", 1, impl=torch.tanh),
    _op("sigmoid", 1, impl=torch.sigmoid),
    _op("relu", 1, impl=torch.relu),
    _op("erf", 1, impl=torch.erf),
    _op("gelu", 1, "approximate:String", impl=gelu),
    # reductions over one axis (axes are canonical: negative, counted from the end)
    _op("sum", 1, _REDUCE, impl=reduce_sum),
    _op("compensated_sum", 1, _REDUCE, impl=compensated_sum),
    _op("max", 1, _REDUCE, impl=reduce_max),
    _op("mean", 1, _REDUCE, impl=reduce_mean),
    _op("var", 1, _REDUCE + " correction:i64", impl=var),
    # linear algebra and layout
    _op("matmul", 2, impl=operator.matmul, infix="@"),
    _op("transpose", 1, "dim0:i64 dim1:i64", impl=torch.transpose),
    _op("permute", 1, "perm:String", impl=permute),
    _op("reshape", 1, "shape:String", impl=reshape),
    _op("expand", 1, "shape:String", impl=expand),
    _op("gather", 2, _AXIS, impl=gather),
    _op("index_select", 2, _AXIS, impl=index_select),
    _op("slice", 1, "axis:i64 start:i64 end:i64 step:i64", impl=slice_),
    _op("concat", 2, _AXIS, impl=concat),
    _op("cast", 1, "dtype:String", impl=cast),
    # composites: each has a definition in primitives (checked in tests) and stable kernels
    _op("softmax", 1, _AXIS, impl=softmax),
    _op("log_softmax", 1, _AXIS, impl=log_softmax),
    _op("logsumexp", 1, _REDUCE, impl=logsumexp),
    _op("softplus", 1, impl=softplus),
    _op("logaddexp", 2, impl=logaddexp),
    _op("layer_norm", 3, "eps:f64", impl=layer_norm),
    _op("sdpa", 3, "scale:f64 causal:bool", impl=sdpa),
    _op("linear", 3, impl=F.linear),
    _op("linear_act", 3, "activation:String", impl=linear_act),
    _op("sdpa_masked", 4, "scale:f64", impl=sdpa_masked),
    _op("conv2d", 3, _WINDOW + " groups:i64", impl=conv2d),
    _op("max_pool2d", 1, "kernel:String " + _WINDOW, impl=max_pool2d),
    _op("batch_norm", 5, "eps:f64", impl=batch_norm),
]}

BY_EGG_NAME = {op.egg_name: op for op in OPS.values()}

