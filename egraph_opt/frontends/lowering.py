"""Lowering: one table from torch's spellings (functions, Tensor methods) to Terms.

Each entry is a function with the torch signature it lowers; anything it cannot express exactly raises ``Unsupported``
and the node stays an opaque call, which is always sound."""
from __future__ import annotations

import functools
import math
import operator
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import fx

from . import forms
from .effects import functional
from .forms import Unsupported
from ..lang.ops import shape_attr
from ..lang.program import OpaqueRef, leaves
from ..lang.term import Term

@dataclass(frozen=True)
class Parts:
    """A tuple-valued call whose elements are Terms where expressible (``torch.max(x, dim)``)."""
    items: tuple


@dataclass
class Ctx:
    info_of: dict[int, Any]  # term id -> TensorInfo
    out: Any  # this node's recorded TensorInfo or value
    params: dict  # qualified name -> tensor, for parameters that leaf modules read

    def param(self, name: str, tensor: torch.Tensor) -> Term:
        term = Term("param", (), (name, shape_attr(tensor.shape), str(tensor.dtype).removeprefix("torch.")))
        self.params[name] = tensor
        self.info_of[id(term)] = type(self.out)(tuple(tensor.shape), tensor.dtype)
        return term

    def info(self, t):
        if not isinstance(t, Term):
            raise Unsupported(f"{t!r} is not a tensor of the Term language")
        return self.info_of[id(t)]

    def tensor(self, t) -> Term:
        self.info(t)
        return t

    def rank(self, t) -> int:
        return len(self.info(t).shape)

    def axis(self, t, dim: int) -> int:
        return forms.axis(dim, self.rank(t))

    def out_shape(self) -> str:
        return shape_attr(self.out.shape)

    def floating(self, t) -> bool:
        return self.info(t).dtype.is_floating_point

    def constant(self, value: torch.Tensor) -> Term:
        """A tensor computed while lowering (``lowering_core._fold``): a parameter of this signature's program."""
        return self.param(f"{CONSTANT}{len(self.params)}", value)


TABLE: dict[Any, Callable] = {}
MODULES: dict[type, Callable] = {}  # leaf module types (their forward is not traceable)


def lowers(*targets, table: dict = TABLE):
    """Register a lowering for functions (objects) and Tensor methods (names), or in ``MODULES`` for leaf modules."""
    def register(fn):
        table.update(dict.fromkeys(targets, fn))
        return fn
    return register


def lowering_of(target) -> Callable | None:
    """The lowering of a call: its own, its pure twin's (in place), or for an ATen overload the
    lowering of the torch function (``torch.*``, ``F.*`` builtins) or Tensor method of its name, whose
    signature is its schema (both are generated from it; Python wrappers such as ``F.batch_norm`` are not)."""
    fn, twin = TABLE.get(target), functional(target)
    if fn is None and twin is not None:
        return lowering_of(twin)
    if fn is None and isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable:
        name = target.overloadpacket.__name__
        builtin = getattr(torch, name, None) or getattr(torch._C._nn, name, None)
        fn = (TABLE.get(builtin) if isinstance(builtin, types.BuiltinFunctionType) else None) or TABLE.get(name)
    return fn


def lower(node: fx.Node, args: tuple, kwargs: dict, info_of: dict[int, Any],
          root: torch.nn.Module | None = None, params: dict | None = None, own: list | None = None):
    """The Term (or Parts) for one fx node, or None when it stays opaque. Leaf modules (``root``'s
    submodules) lower by their type; the parameters they read are added to ``params``. A Term that is the call
    itself, one op over the call's own operands and the module's parameters, joins ``own``."""
    ctx = Ctx(info_of, node.meta.get("egraph_opt"), params if params is not None else {})
    if node.op == "call_module":
        module = root.get_submodule(node.target)
        fn, args = next((f for t, f in MODULES.items() if isinstance(module, t)), None), (module, node.target, *args)
    else:
        fn = lowering_of(node.target) if node.op in ("call_function", "call_method") else None
    if _unlowered(node, args, kwargs, ctx):
        return None
    calls = FALLBACKS if node.op in ("call_function", "call_method") else []
    terms = [a for a in leaves((args, kwargs)) if isinstance(a, Term)]  # a call of constants (DeBERTa's sqrt(d)): first
    folded = calls and (any(known(a, CONSTANT) for a in terms) or
                        terms and all(known(a) or a.op == "const" for a in terms))
    result = calls[0](node, args, kwargs, ctx) if folded else None
    try:
        result = result or (fn(ctx, *args, **kwargs) if fn is not None else None)
    except (Unsupported, TypeError, KeyError, ValueError):  # an argument the lowering does not take
        result = None
    if own is not None and isinstance(result, Term) and fn is not None and not folded:
        operands = {id(a) for a in leaves((args, kwargs)) if isinstance(a, Term)}
        if all(id(a) in operands or a.op == "param" and not known(a, CONSTANT) and node.op == "call_module"
               for a in result.args):
            own.append(result)
    for fallback in calls:
        result = result or fallback(node, args, kwargs, ctx)
    if isinstance(result, Term):  # assigned: an id may be a dead Term's (a refused decomposition's)
        info_of[id(result)] = ctx.out
    return result if isinstance(result, (Term, Parts)) else None


CONSTANT = "_constant"  # the prefix of the parameters ``Ctx.constant`` makes
FALLBACKS: list[Callable] = []  # (node, args, kwargs, ctx) -> Term, Parts or None: ``lowering_core``'s


def known(t, kinds=(CONSTANT, "_tensor_constant", "lifted_tensor")) -> bool:
    """A constant of the signature: folded here (``CONSTANT``), or a tensor the trace (a submodule) closed over."""
    return isinstance(t, Term) and t.op == "param" and t.attrs[0].rsplit(".", 1)[-1].startswith(kinds)


def _unlowered(node: fx.Node, args: tuple, kwargs: dict, c: Ctx) -> bool:
    """A size-0 axis in an operand or the first result (embedding_bag's max_indices stay with the call): nothing to
    optimize, and the ranges of the rules, proved over values, say nothing of a reduction over no values (logsumexp of
    none is -inf). A complex operand or result (a rotary embedding as complex products): the op table and its rules are
    over the reals (sqrt(x^2) = |x| is not so over C). Such calls stay opaque."""
    found = [c.info_of.get(id(a)) for a in leaves((args, kwargs)) if isinstance(a, Term)]
    if lowering_of(node.target) is _cat:  # its lowering drops the 1-D empty operands torch.cat skips
        found = [info for info in found if tuple(getattr(info, "shape", ())) != (0,)]
    found += leaves(c.out[:1] if isinstance(c.out, tuple) else c.out)
    return any(0 in getattr(info, "shape", (1,)) or getattr(getattr(info, "dtype", None), "is_complex", False) is True
               for info in found)


def _operand(c: Ctx, x, other) -> Term:
    """A tensor operand, or a number beside a floating tensor as a const: a Python number, or a
    0-d tensor the trace captured (``torch.tensor(2.0)``, closed over) that acts as one (the result
    keeps the other operand's dtype), in one form whatever its spelling (``forms.constant``)."""
    held = x.args[0] if isinstance(x, Term) and x.op == "expand" else x  # a number made a tensor (torch.full)
    if known(held) and isinstance(other, Term) and other.op != "const":
        value = c.params.get(held.attrs[0])
        if isinstance(value, torch.Tensor) and value.numel() and not value.requires_grad \
                and not value.is_complex() and value.dtype != torch.bool \
                and c.floating(other) and getattr(c.out, "dtype", None) == c.info(other).dtype \
                and (not c.rank(x) or value.dtype == c.out.dtype and tuple(c.info(other).shape)
                     == tuple(c.out.shape) and bool((value == value.flatten()[0]).all())) \
                and (not known(held, CONSTANT) or float(value.flatten()[0].float()) == value.flatten()[0].item()):
            x = value.flatten()[0].item()  # one number, which broadcasting does not widen
    if isinstance(x, Term):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool) and isinstance(other, Term) and c.floating(other):
        if math.isnan(x):  # legal, but the rules are identities of numbers: the call stays opaque
            raise Unsupported("a NaN constant")
        return forms.constant(x, str(c.info(other).dtype).removeprefix("torch."))
    raise Unsupported(f"operand {x!r}")


def safe_rows(m: Term, rows: Term, dtype: str) -> Term:
    """``rows`` (of ``dtype``), but exp(m) (0, or NaN where m is) where m, a row's maximum score,
    is -inf or NaN: torch's _safe_softmax and attention kernel give 0 for a row whose every key
    is masked. There min(m, 0) - min(m, 0) is NaN; elsewhere it is 0 and ``rows`` stand."""
    low_m = Term("minimum", (m, Term.const(0.0)))
    masked = Term("isnan", (Term("sub", (low_m, low_m)),))
    return Term("where", (masked, Term("cast", (Term("exp", (m,)),), (dtype,)), rows))


def _binary(op: str):
    def lower_binary(c, a, b, *, alpha=1, rounding_mode=None):
        if alpha != 1 or rounding_mode is not None:
            raise Unsupported("alpha / rounding_mode")
        return forms.binary(op, _operand(c, a, b), _operand(c, b, a))
    return lower_binary


for _name, _targets in {
    "add": (operator.add, torch.add, "add"), "sub": (operator.sub, torch.sub, "sub"),
    "mul": (operator.mul, torch.mul, "mul"), "div": (operator.truediv, torch.div, "div"),
    "pow": (operator.pow, torch.pow, "pow"), "maximum": (torch.maximum, "maximum"),
    "minimum": (torch.minimum, "minimum"), "logaddexp": (torch.logaddexp, "logaddexp"),
    "atan2": (torch.atan2, torch.arctan2, "atan2", "arctan2"), "hypot": (torch.hypot, "hypot"),
    "fmod": (torch.fmod, "fmod"), "copysign": (torch.copysign, "copysign"), "remainder": (operator.mod, torch.remainder, "remainder"),
}.items():
    lowers(*_targets)(_binary(_name))

for _name in ("exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "abs", "sin", "cos", "tanh",
              "sigmoid", "relu", "silu", "erf", "neg", "tan", "atan", "asinh", "acosh", "atanh", "isnan",
              "logical_not", "floor", "ceil", "round", "trunc", "asin", "acos", "sinh", "cosh", "log2", "log10"):
    lowers(*(t for t in (getattr(torch, _name, None), getattr(F, _name, None), _name,
                         getattr(operator, _name, None)) if t is not None))(
        lambda c, x, *, _op=_name, inplace=False: Term(_op, (c.tensor(x),)))

lowers(operator.invert, torch.bitwise_not, "bitwise_not")(  # ~mask of a boolean mask; of integers, bits (opaque)
    lambda c, x: Term("logical_not", (x,)) if c.info(x).dtype == torch.bool else None)


def _bits(op: str):
    """& | ^ (and logical_and, logical_or, logical_xor) of boolean masks; of other tensors, opaque."""
    def lower_bits(c, a, b):
        if not all(isinstance(t, Term) and c.info(t).dtype == torch.bool for t in (a, b)):
            raise Unsupported("a bitwise or logical op of tensors that are not both boolean")
        return _below_or_nan(c, a, b, True) if op == "xor" else Term(op, (a, b))
    return lower_bits


for _name, _op, _operator in (("and", "minimum", operator.and_), ("or", "maximum", operator.or_),
                              ("xor", "xor", operator.xor)):
    lowers(getattr(torch, f"bitwise_{_name}"), getattr(torch, f"logical_{_name}"), f"bitwise_{_name}",
           f"logical_{_name}", _operator, f"__{_name}__")(_bits(_op))

lowers(torch.reciprocal, "reciprocal")(lambda c, x: Term("div", (Term.const(1.0), x)) if c.floating(x) else None)


@lowers(torch.sign, "sign")
def _sign(c, x):
    """(0 < x) - (x < 0), as torch computes it: 0 at NaN and at either zero."""
    zero, dtype = Term.const(0.0), str(c.info(x).dtype).removeprefix("torch.")
    if not c.floating(x):
        raise Unsupported("the sign of integers")
    return Term("sub", tuple(Term("cast", (Term("less", pair),), (dtype,)) for pair in ((zero, x), (x, zero))))


lowers(F.gelu)(lambda c, x, approximate="none": Term("gelu", (c.tensor(x),), (approximate,)))
lowers(F.softplus)(  # exact; torch's threshold differs by < 3e-9. With another beta: a refusal (None)
    lambda c, x, beta=1.0, threshold=20.0: Term("softplus", (c.tensor(x),)) if beta == 1 else None)


@lowers(torch.clamp, "clamp", torch.clip, "clip")
def _clamp(c, x, min=None, max=None):
    low = x if min is None else Term("maximum", (x, _operand(c, min, x)))
    return low if max is None else Term("minimum", (low, _operand(c, max, x)))


lowers(operator.lt, torch.lt, "lt", torch.less, "less")(_binary("less"))
lowers(operator.gt, torch.gt, "gt", torch.greater, "greater")(  # a > b is b < a, NaN too
    lambda c, a, b: Term("less", (_operand(c, b, a), _operand(c, a, b))))
lowers(torch.where)(lambda c, cond, a, b: Term("where", (cond, _operand(c, a, b), _operand(c, b, a))))
lowers(F.hardtanh, torch._C._nn.hardtanh)(lambda c, x, lo=-1.0, hi=1.0, inplace=False: _clamp(c, x, lo, hi))  # ReLU6


def is_zero(x: Term) -> Term:
    """``x == 0`` as a bool, without a comparison op: a where negating cast(x, bool), ``x != 0`` (NaN, -0.0 too)."""
    nonzero = Term("cast", (x,), ("bool",))
    return Term("cast", (Term("where", (nonzero, Term.const(0.0), Term.const(1.0))),), ("bool",))


def _below_or_nan(c, a, b, both: bool) -> Term:
    """b < a (or a < b too, where ``both``: ``a != b``, which x - c != 0 is not at inf), or a NaN:
    the or (maximum) of bools. Its negation is ``a <= b``."""
    a, b = _operand(c, a, b), _operand(c, b, a)
    masks = [Term("less", (b, a))] + [Term("less", (a, b))] * both
    masks += [Term("isnan", (t,)) for t in (a, b) if t.op != "const" and c.floating(t)]  # a const never is
    return functools.reduce(lambda x, y: Term("maximum", (x, y)), masks)


lowers(operator.ne, torch.ne, "ne")(lambda c, a, b: _below_or_nan(c, a, b, True))
lowers(operator.le, torch.le, "le")(lambda c, a, b: Term("logical_not", (_below_or_nan(c, a, b, False),)))
lowers(operator.ge, torch.ge, "ge")(lambda c, a, b: Term("logical_not", (_below_or_nan(c, b, a, False),)))


@lowers(operator.eq, torch.eq, "eq")
def _eq(c, x, other):
    return is_zero(c.tensor(x)) if isinstance(other, (int, float)) and not isinstance(other, bool) and other == 0 \
        else Term("logical_not", (_below_or_nan(c, x, other, True),))  # x == 0: the form the rules know


lowers("masked_fill")(lambda c, x, mask, value: Term("where", (mask, _operand(c, value, x), x)))


@lowers(torch.index_put, "index_put")
def _index_put(c, x, indices, values, accumulate=False):
    """``x[mask] = values``, one boolean mask of x's leading axes, values broadcast over what it masks: a where."""
    (mask,) = indices  # several indices: a ValueError, a refusal
    lead, shape, value = tuple(c.info(mask).shape), tuple(c.info(x).shape), _operand(c, values, x)
    k, lifted = len(lead), (1,) * (len(shape) - c.rank(value)) + tuple(c.info(value).shape) \
        if value.op != "const" else (1,) * len(shape)
    if accumulate or c.info(mask).dtype != torch.bool or lead != shape[:k] or len(lifted) != len(shape) \
            or any(n != 1 for n in lifted[:k]) or any(n not in (1, m) for n, m in zip(lifted[k:], shape[k:])):
        raise Unsupported("index_put other than of one value per element by a boolean mask")
    mask = mask if k == len(shape) else Term("reshape", (mask,), (shape_attr(lead + (1,) * (len(shape) - k)),))
    return Term("where", (mask, value if value.op == "const" else _cast(c, value, c.info(x).dtype), x))


def _reduce(op: str, c: Ctx, x, dim, keepdim: bool, dtype=None) -> Term:
    rank, x = c.rank(x), _cast(c, x, dtype) if dtype is not None else x
    dims = range(rank) if dim is None or dim == [] or dim == () else [dim] if isinstance(dim, int) else dim
    return forms.reduce(op, x, dims, rank, keepdim)


for _name in ("sum", "mean", "prod"):
    lowers(getattr(torch, _name), _name)(lambda c, x, dim=None, keepdim=False, *, dtype=None, _op=_name:
                                         _reduce(_op, c, x, dim, keepdim, dtype))

lowers(torch.any, "any")(lambda c, x, dim=None, keepdim=False: _cast(c, x, torch.bool) if dim in ([], ())
                         else _reduce("max", c, x, dim, keepdim, torch.bool))  # any(x, dim=[]) reduces none


def _arg(op: str):
    """argmax / argmin along one axis; with none, of the flattened tensor (kept: a call)."""
    def lower_arg(c, x, dim=None, keepdim=False):
        if dim is None and keepdim:
            raise Unsupported(f"{op} of every axis, kept")
        flat = x if dim is not None else Term("reshape", (c.tensor(x),), (str(math.prod(c.info(x).shape)),))
        return Term(op, (flat,), (-1 if dim is None else c.axis(x, dim), keepdim))
    return lower_arg


for _name in ("argmax", "argmin"):
    lowers(getattr(torch, _name), _name)(_arg(_name))

lowers(torch.amax, "amax")(_amax := lambda c, x, dim=(), keepdim=False:  # no dim: every axis
                           _reduce("max", c, x, None if dim == () else dim, keepdim))


@lowers(torch.max, "max")
def _max(c, x, dim=None, keepdim=False):
    if isinstance(dim, Term):
        return Term("maximum", (x, _operand(c, dim, x)))
    out = _reduce("max", c, x, dim, keepdim)  # of every element, or (values, indices) along one axis
    return out if dim is None else Parts((out, None))


def _negated(c, x, lower, *args):
    """min as -max(-x): negation is exact in floating point."""
    if not c.floating(x):
        raise Unsupported("the min of integers")
    neg = Term("neg", (x,))
    c.info_of[id(neg)] = c.info(x)
    out = lower(c, neg, *args)
    return Parts((Term("neg", (out.items[0],)), None)) if isinstance(out, Parts) else Term("neg", (out,))


lowers(torch.amin, "amin")(lambda c, x, dim=(), keepdim=False: _negated(c, x, _amax, dim, keepdim))
lowers(torch.min, "min")(lambda c, x, dim=None, keepdim=False: Term("minimum", (x, _operand(c, dim, x)))
                         if isinstance(dim, Term) else _negated(c, x, _max, dim, keepdim))


@lowers(torch.var, "var")
def _var(c, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Over several axes, over one that holds them all (moved last, merged)."""
    if unbiased is not None and correction is not None:
        raise Unsupported("both unbiased and correction")
    corr = int(correction if correction is not None else (1 if unbiased in (None, True) else 0))
    shape = tuple(c.info(x).shape)
    axes = sorted({c.axis(x, d) % len(shape) for d in ([dim] if isinstance(dim, int) else dim or range(len(shape)))})
    if len(axes) == 1:
        return Term("var", (x,), (c.axis(x, axes[0]), keepdim, corr))
    rest = [a for a in range(len(shape)) if a not in axes]
    moved = forms.permute(x, rest + axes, len(shape))
    merged = Term("reshape", (moved,), (shape_attr([shape[a] for a in rest] + [math.prod(shape[a] for a in axes)]),))
    return Term("reshape", (Term("var", (merged,), (-1, False, corr)),), (c.out_shape(),))


@lowers(torch.var_mean, "var_mean")
def _var_mean(c, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    c.out = c.out[0]  # the shape both have
    return Parts((_var(c, x, dim, unbiased, keepdim, correction=correction), _reduce("mean", c, x, dim, keepdim)))


@lowers(operator.getitem)
def _getitem(c, x, index):
    """An element of a tuple-valued call; an index of a tensor lowers through torch's decomposition
    (slices, selects and unsqueezes, or a gather at constant positions)."""
    return x.parts.items[index] if isinstance(x, OpaqueRef) and isinstance(getattr(x, "parts", None), Parts) else None


lowers(getattr)(lambda c, x, name: _getitem(c, x, 0) if name == "values" else None)  # torch.max(x, dim).values


def _softmax_like(op):
    """The third argument is a dtype (torch's, the method's, ATen's softmax.int), a half-to-float
    flag (ATen's _softmax) or a stack level (F's): only a dtype casts."""
    def lower_softmax(c, x, dim=None, third=None, dtype=None, _stacklevel=3):
        dtype = third if isinstance(third, torch.dtype) else dtype
        if dim is None:
            raise Unsupported("implicit softmax dim")
        axis = c.axis(x, dim)  # before the cast, whose Term has no recorded shape
        inner = c.info_of.get(id(x.args[0])) if x.op == "reshape" and axis == -1 else None
        if inner is not None and tuple(inner.shape[-1:]) == tuple(c.out.shape[-1:]):  # over the last
            y = lower_softmax(c, x.args[0], -1, dtype=dtype)  # axis, the softmax of a view is a view
            c.info_of[id(y)] = type(inner)(tuple(inner.shape), c.out.dtype)
            return Term("reshape", (y,), (c.out_shape(),))
        return Term(op, (_cast(c, x, dtype) if dtype is not None else x,), (axis,))
    return lower_softmax


lowers(torch.softmax, torch._softmax, F.softmax, "softmax")(_softmax_like("softmax"))
lowers(torch.log_softmax, torch._log_softmax, F.log_softmax, "log_softmax")(_softmax_like("log_softmax"))


@lowers(torch.logsumexp, "logsumexp")
def _logsumexp(c, x, dim, keepdim=False):
    (axis,) = [dim] if isinstance(dim, int) else dim  # one axis (several: ValueError, a refusal)
    return Term("logsumexp", (x,), (c.axis(x, axis), keepdim))


lowers(operator.matmul, torch.matmul, "matmul", torch.mm, "mm", torch.bmm, "bmm")(
    lambda c, a, b: Term("matmul", (c.tensor(a), c.tensor(b))))


@lowers(torch.transpose, "transpose", torch.t, "t")
def _transpose(c, x, dim0=0, dim1=-1):  # t: of a 0-D or 1-D tensor, itself
    a, b = sorted((c.axis(x, dim0), c.axis(x, dim1)))
    return x if a == b else Term("transpose", (x,), (a, b))


lowers(torch.permute, "permute")(lambda c, x, *dims: forms.permute(  # dims, or one list of them
    x, dims[0] if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else dims, c.rank(x)))


@lowers(torch.stack, "stack")
def _stack(c, tensors, dim=0):
    """Along a new axis: each operand reshaped to hold it, one concat (GLM's interleaved rotate_half was a gather)."""
    shape = list(c.out.shape)
    axis, shape[dim % len(shape)] = dim % len(shape) - len(shape), 1
    return forms.concat([Term("reshape", (c.tensor(t),), (shape_attr(shape),)) for t in tensors], axis)


@lowers(torch.repeat_interleave, "repeat_interleave")
def _repeat_interleave(c, x, repeats, dim=None, *, output_size=None):
    """Each element ``repeats`` times in a row along ``dim``: an axis of 1 expanded after it, merged (not a gather)."""
    if not isinstance(repeats, int) or dim is None or not c.rank(x):
        raise Unsupported("repeat_interleave by a tensor of counts, or of a flattened or 0-d tensor")
    shape, at = list(c.info(x).shape), dim % c.rank(x) + 1
    one = Term("reshape", (c.tensor(x),), (shape_attr(shape[:at] + [1] + shape[at:]),))
    wide = Term("expand", (one,), (shape_attr(shape[:at] + [repeats] + shape[at:]),))
    return Term("reshape", (wide,), (c.out_shape(),))


lowers("numpy_T")(lambda c, x: forms.permute(x, range(c.rank(x))[::-1], c.rank(x)))  # x.T (Falcon's x @ w.T)
lowers("mT")(lambda c, x: _transpose(c, x, -2, -1))


def _heads(c, t: Term):
    """(x, its leading axes) where ``t`` is x (rank > 3) with those flattened into one, or its K^T, or either scaled by
    a number (DeBERTa's ``k^T / sqrt(d)``)."""
    if t.op in ("mul", "div") and t.args[-1].op == "const" and (inner := _heads(c, t.args[0])):
        return Term(t.op, (inner[0], t.args[1]), t.attrs), inner[1]
    swap = t.op == "transpose" and t.attrs == (-2, -1)
    flat = t.args[0] if swap else t
    inner = tuple(getattr(c.info_of.get(id(flat.args[0])), "shape", ())) if flat.op == "reshape" else ()
    if len(inner) > 3 and tuple(getattr(c.info_of.get(id(flat)), "shape", ())[1:]) == inner[-2:]:
        return (Term("transpose", (flat.args[0],), (-2, -1)) if swap else flat.args[0]), inner[:-2]


def _split_heads(c, x: Term, shape: tuple) -> Term | None:
    """``x`` of (B * H, ...) viewed as ``shape`` (B, H, ...), where x is a bmm of heads flattened, maybe
    scaled and biased elementwise (baddbmm: GPT-NeoX's zeros, BLOOM's alibi): the product over heads and
    the same steps, each operand of B * H rows viewed alike, a broadcast one kept. None elsewhere."""
    if x.op == "matmul":
        parts = [_heads(c, t) for t in x.args]
        return Term("matmul", (parts[0][0], parts[1][0])) if None not in parts and \
            parts[0][1] == parts[1][1] == shape[:-2] and c.info(x).shape[-2:] == shape[-2:] else None
    info = c.info_of.get(id(x))
    if x.op not in ("add", "mul") or info is None or len(info.shape) != 3 or info.shape[1:] != shape[-2:]:
        return None
    dims = [() if a.op == "const" else getattr(c.info_of.get(id(a)), "shape", None) for a in x.args]
    split = [_split_heads(c, a, shape) if d == info.shape else None for a, d in zip(x.args, dims)]
    if all(s is None for s in split) or any(d is None or len(d) == 3 and d[0] not in (1, info.shape[0]) for d in dims):
        return None
    return Term(x.op, tuple(s if s is not None else a if len(d) < 3 or d[0] == 1 else Term(
        "reshape", (a,), (shape_attr(shape[:-2] + d[1:]),)) for a, s, d in zip(x.args, split, dims)), x.attrs)


@lowers(torch.reshape, "reshape", "view", torch.flatten, "flatten", torch.unsqueeze, "unsqueeze",
        torch.squeeze, "squeeze", "view_as", "reshape_as", "_unsafe_view")
def _reshape(c, x, *args, **kwargs):
    """A view of a view is one view; a bmm of heads flattened (B*H, T, D), viewed back to the heads,
    is the batched matmul over them (BART, Whisper, CLIP): attention meets fusion in one layout."""
    shape = tuple(c.out.shape)
    if (split := _split_heads(c, x, shape)) is not None:
        return split
    x = x.args[0] if x.op == "reshape" and id(x.args[0]) in c.info_of else x
    return x if tuple(c.info(x).shape) == shape else Term("reshape", (x,), (c.out_shape(),))


lowers("expand", "expand_as")(lambda c, x, *args, **kwargs: x if tuple(c.info(x).shape) == tuple(c.out.shape)
                              else Term("expand", (x,), (c.out_shape(),)))  # to the traced shape

lowers("contiguous", "clone", torch.clone, "detach", torch.detach, "alias", "lift_fresh_copy")(
    lambda c, x, *args, memory_format=None: c.tensor(x))


def _dropout(training: bool):
    """Every spelling of dropout: the identity with p = 0 or outside training (where it draws: None)."""
    return lambda c, x, p=0.5, training=training, inplace=False: None if training and p > 0 else c.tensor(x)


lowers(F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, torch.dropout, torch.feature_dropout,
       torch.alpha_dropout, torch.feature_alpha_dropout)(_dropout(True))
lowers(F.alpha_dropout, F.feature_alpha_dropout)(_dropout(False))


def _cast(c, x, dtype) -> Term:
    if not isinstance(dtype, torch.dtype):
        raise Unsupported(f"cast to {dtype!r}")
    return x if c.info(x).dtype == dtype else Term("cast", (x,), (str(dtype).removeprefix("torch."),))


@lowers("to", "type", torch.ops.aten._to_copy.default)
def _to(c, x, *args, **kwargs):
    """A cast: to a dtype, to another tensor's (the same dtype: x itself), or none (a copy); the
    options that keep values (copy, non_blocking, memory_format; ATen's, left None) read as such."""
    if {k for k, v in kwargs.items() if v is not None} - {"dtype", "copy", "non_blocking", "memory_format"} \
            or len(args) > 1:
        raise Unsupported("to() with a device or layout")
    dtype = kwargs.get("dtype", args[0] if args else None)
    return c.tensor(x) if dtype is None else _cast(c, x, c.info(dtype).dtype if isinstance(dtype, Term) else dtype)


lowers("type_as")(lambda c, x, other: _cast(c, x, c.info(other).dtype))

for _method, _dtype in {"float": torch.float32, "half": torch.float16, "double": torch.float64,
                        "bfloat16": torch.bfloat16}.items():
    lowers(_method)(lambda c, x, _d=_dtype: _cast(c, x, _d))


@lowers(torch.cat, torch.concat, torch.concatenate)
def _cat(c, tensors, dim=0):
    if not tensors or not all(isinstance(t, Term) for t in tensors):
        raise Unsupported("cat of non-tensors")
    # torch.cat skips 1-D empty operands (a cache's first update appends to ``torch.tensor([])``)
    kept = [t for t in tensors if tuple(c.info(t).shape) != (0,)]
    if len(kept) < len(tensors) and not (kept and all(c.info(t).dtype == c.out.dtype for t in kept)):
        raise Unsupported("cat of a 1-D empty tensor that sets the result's dtype")
    return forms.concat(kept, c.axis(kept[0], dim))


@lowers("repeat", torch.ops.aten.repeat.default)
def _repeat(c, x, *repeats):
    """``x.repeat(r0, r1, ...)``: copies side by side along each axis, as concats (shapes a size family extends; the
    affine lowering's gather reads a constant index that grows with the size)."""
    reps = tuple(repeats[0] if len(repeats) == 1 and not isinstance(repeats[0], int) else repeats)
    if not all(reps) or len(reps) < c.rank(x):
        raise Unsupported("a repeat with a zero count, or fewer counts than axes")
    y = Term("reshape", (x,), (shape_attr((1,) * (len(reps) - c.rank(x)) + tuple(c.info(x).shape)),))
    for axis, count in enumerate(reps):
        y = forms.concat([y] * count, axis - len(reps))
    return y


@lowers(F.pad, torch._C._nn.pad, torch.constant_pad_nd)
def _pad(c, x, pad, mode="constant", value=None):
    """A constant pad: along each padded axis, x between blocks of the value (a number expanded: sizes a size family
    extends), not the affine lowering's gather at a constant index as large as the output (MobileNetV2's 52)."""
    mode, value = ("constant", mode) if not isinstance(mode, str) else (mode, value)  # constant_pad_nd(x, pad, value)
    if mode != "constant" or any(n < 0 for n in pad):
        raise Unsupported("a pad that is no constant one, or crops")
    fill, shape = c.constant(torch.tensor(0.0 if value is None else value, dtype=c.info(x).dtype)), list(c.info(x).shape)
    for axis, n, first in ((len(shape) - 1 - i // 2, n, i % 2 == 0) for i, n in enumerate(pad) if n):
        block = Term("expand", (fill,), (shape_attr(shape[:axis] + [n] + shape[axis + 1:]),))
        x, shape[axis] = Term("concat", (block, x) if first else (x, block), (axis - len(shape),)), shape[axis] + n
    return x


@lowers(torch.split, "split", torch.split_with_sizes)
def _split(c, x, split_size_or_sections, dim=0):
    """Pieces along one axis, as slices: QKV projections split from one matmul stay Terms."""
    size, sizes = c.info(x).shape[dim], split_size_or_sections  # valid: the traced run split by them
    sizes = [min(sizes, size - start) for start in range(0, size, sizes)] if isinstance(sizes, int) else sizes
    axis, starts = c.axis(x, dim), [sum(sizes[:i]) for i in range(len(sizes))]
    return Parts(tuple(Term("slice", (x,), (axis, a, a + n, 1)) for a, n in zip(starts, sizes)))


for _name in ("gather", "index_select"):
    lowers(getattr(torch, _name), _name)(
        lambda c, x, dim, index, *, sparse_grad=False, _op=_name: Term(_op, (x, index), (c.axis(x, dim),)))
