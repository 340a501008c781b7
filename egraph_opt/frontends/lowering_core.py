"""The Core ATen opset (ops tagged ``torch.Tag.core``), which torch's decompositions reach: the
overloads that neither a torch spelling of their name (``lowering.lowering_of``) nor their own
decomposition lowers. Exact compositions of the Term language's ops only: an op with no exact
form raises ``Unsupported`` for those operands (tests/test_core_aten.py lists what stays a call,
and why)."""
from __future__ import annotations

import functools
import math

import torch

from . import forms
from . import lowering as low
from . import lowering_nn as nn_low
from .lowering import Parts, Unsupported, lowers
from ..lang.ops import shape_attr
from ..lang.term import Term

aten = torch.ops.aten

def _bool(c, x) -> Term:
    """``x != 0`` (NaN included) as a bool tensor: what the logical ops read."""
    return x if c.info(x).dtype == torch.bool else Term("cast", (c.tensor(x),), ("bool",))


def _logical(op: str, bits: bool):
    """and / or / xor of truth values (bitwise of bools is logical; of integers, bits: opaque)."""
    def lower(c, a, b):
        if bits and not (c.info(a).dtype == torch.bool and isinstance(b, Term) and c.info(b).dtype == torch.bool):
            raise Unsupported("bitwise op of integers")
        a, b = _bool(c, a), _bool(c, b)
        return low.unequal(c, a, b) if op == "xor" else Term(op, (a, b))
    return lower


for _name, _op in (("and", "minimum"), ("or", "maximum"), ("xor", "xor")):
    lowers(getattr(aten, f"logical_{_name}").default)(_logical(_op, False))
    lowers(getattr(aten, f"bitwise_{_name}").Tensor, getattr(aten, f"bitwise_{_name}").Scalar)(_logical(_op, True))
lowers(aten.logical_not.default)(lambda c, x: Term("logical_not", (_bool(c, x),)))


def _reduce(op: str, c, x, t: Term, dim, keepdim: bool) -> Term:
    """``op`` of ``t``, a new Term of ``x``'s shape, over ``dim`` (None: every axis)."""
    rank = c.rank(x)
    dims = range(rank) if dim is None or dim == [] or dim == () else [dim] if isinstance(dim, int) else dim
    return forms.reduce(op, t, dims, rank, keepdim)  # no axes named: every axis, as torch reads it


@lowers(aten.any.default, aten.any.dim, aten.any.dims)
def _any(c, x, dim=None, keepdim=False):
    """any(x, dim=[]) reduces no axis (sum's empty list reduces every one)."""
    return _bool(c, x) if dim in ([], ()) else _reduce("max", c, x, _bool(c, x), dim, keepdim)


def _floating(c, x) -> Term:
    if not c.floating(x):
        raise Unsupported("an integer operand")
    return x


@lowers(aten.amin.default, aten.min.dim)
def _amin(c, x, dim=(), keepdim=False):
    """min(x) = -max(-x) in floating point (negation is exact)."""
    out = _reduce("max", c, x, Term("neg", (_floating(c, x),)), dim if dim != () else None, keepdim)
    return Term("neg", (out,)) if isinstance(dim, (tuple, list)) else Parts((Term("neg", (out,)), None))


@lowers(aten.reciprocal.default)
def _reciprocal(c, x):
    return Term("div", (Term.const(1.0), _floating(c, x)))


@lowers(aten.sign.default)
def _sign(c, x):
    """(0 < x) - (x < 0), as torch computes it: 0 at NaN and at either zero."""
    dtype = str(c.info(_floating(c, x)).dtype)[6:]
    zero = Term.const(0.0)
    return Term("sub", (Term("cast", (Term("less", (zero, x)),), (dtype,)),
                        Term("cast", (Term("less", (x, zero)),), (dtype,))))


@lowers(aten._to_copy.default)
def _to_copy(c, x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None or layout not in (None, torch.strided):
        raise Unsupported("a copy to another device or layout")
    return low._cast(c, x, dtype) if dtype is not None else c.tensor(x)


@lowers(aten.copy.default)
def _copy(c, x, src, non_blocking=False):
    """``src`` in ``x``'s dtype and shape (x's values are overwritten)."""
    out = low._cast(c, c.tensor(src), c.info(x).dtype)
    return out if tuple(c.info(src).shape) == tuple(c.out.shape) else Term("expand", (out,), (c.out_shape(),))


@lowers(aten.native_dropout.default)
def _native_dropout(c, x, p, train):
    """(x, its mask of ones) outside training or with p = 0; the mask stays with the call."""
    return Parts((low._dropout(True)(c, x, p, bool(train)), None))


@lowers(aten.native_layer_norm.default)
def _native_layer_norm(c, x, normalized_shape, weight, bias, eps):
    if len(normalized_shape) != 1:
        raise Unsupported("layer norm over several axes")
    w, b = (Term.const(v) if t is None else t for t, v in ((weight, 1.0), (bias, 0.0)))
    return Parts((Term("layer_norm", (x, w, b), (float(eps),)), None, None))


@lowers(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(c, x, weight, bias, running_mean, running_var, momentum, eps):
    if weight is None or bias is None:
        raise Unsupported("batch norm without affine parameters")
    return Parts((Term("batch_norm", (x, running_mean, running_var, weight, bias), (float(eps),)), None, None))


@lowers(aten.native_group_norm.default)
def _group_norm(c, x, weight, bias, n, channels, hxw, groups, eps):
    """(x - mean) rsqrt(var + eps) over each group, then the per-channel affine."""
    shape = tuple(c.info(x).shape)
    rows = Term("reshape", (x,), (shape_attr((n, groups, channels // groups * hxw)),))
    mean, var = Term("mean", (rows,), (-1, True)), Term("var", (rows,), (-1, True, 0))
    eps_ = forms.constant(eps, str(c.info(x).dtype)[6:])
    normed = Term("mul", (Term("sub", (rows, mean)), Term("rsqrt", (forms.binary("add", var, eps_),))))
    out = Term("reshape", (normed,), (shape_attr(shape),))
    per_channel = shape_attr((channels,) + (1,) * (len(shape) - 2))
    for t, op in ((weight, "mul"), (bias, "add")):
        out = out if t is None else Term(op, (out, Term("reshape", (t,), (per_channel,))))
    return Parts((out, None, None))


@lowers(aten.convolution.default)
def _convolution(c, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed or c.rank(x) != 4:
        raise Unsupported("a transposed convolution, or not over two spatial axes")
    return nn_low._conv2d(c, x, weight, bias, stride, padding, dilation, groups)


@lowers(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(c, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return Parts((nn_low._max_pool2d(c, x, kernel_size, stride, padding, dilation, ceil_mode), None))


def _window_mean(c, x, kernel) -> Term:
    """The mean over each window of non-overlapping windows that tile the last axes (one per
    window size; those before them are batch and channel axes)."""
    shape = tuple(c.info(x).shape)
    lead, out = len(shape) - len(kernel), x
    for axis, (n, k) in enumerate(zip(shape[lead:], kernel)):
        if n % k:
            out = Term("slice", (out,), (axis - len(kernel), 0, n - n % k, 1))
    split = shape[:lead] + sum(((n // k, k) for n, k in zip(shape[lead:], kernel)), ())
    return forms.reduce("mean", Term("reshape", (out,), (shape_attr(split),)),
                        range(lead + 1, len(split), 2), len(split), False)


@lowers(aten.avg_pool1d.default, aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(c, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    kernel = list(kernel_size) * (c.rank(x) - 2 if len(kernel_size) == 1 else 1)
    if list(stride or kernel) != kernel or any(padding if isinstance(padding, (list, tuple)) else [padding]) \
            or ceil_mode or divisor_override:
        raise Unsupported("overlapping, padded or ceil-mode windows")
    return _window_mean(c, x, kernel)


@lowers(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool(c, x, output_size):
    """Windows that tile each spatial axis: its size a multiple of the output's."""
    spatial = c.info(x).shape[c.rank(x) - len(output_size):]
    if any(n % o for n, o in zip(spatial, output_size)):
        raise Unsupported("windows of several sizes")
    return _window_mean(c, x, [n // o for n, o in zip(spatial, output_size)])


#: ops each of whose elements is a copy of one element of their tensor operands, at positions that
#: shapes and constant arguments alone decide
MOVES = (aten.flip.default, aten.repeat.default, aten.diagonal.default, aten.reflection_pad1d.default,
         aten.reflection_pad2d.default, aten.reflection_pad3d.default, aten.replication_pad2d.default,
         aten.replication_pad3d.default, aten.upsample_nearest2d.vec, aten.slice_scatter.default,
         aten.select_scatter.default, aten.scatter.src, aten.index.Tensor, aten.index_put.default,
         aten.masked_scatter.default, aten.constant_pad_nd.default, aten.scatter.value)
#: moves that also write a number (their argument at this position): one more element of the pool
FILLS = {aten.constant_pad_nd.default: 2, aten.scatter.value: 3}


def _moved(c, *args, _op=None, **kwargs):
    """The op run here on the positions of its operands' elements (float64 counts, each operand
    after the ones before it, then the number it writes) says where each of its elements comes
    from: one index_select of the operands flattened and concatenated, at that index (a constant)."""
    data = [a for a in args if isinstance(a, Term) and not low.known(a)]
    if not data or len({c.info(a).dtype for a in data}) > 1:
        raise Unsupported("operands of several dtypes")
    at, start = {}, 0
    for a in data:
        n = math.prod(c.info(a).shape)
        at[id(a)], start = torch.arange(start, start + n, dtype=torch.float64).reshape(c.info(a).shape), start + n
    flat = [Term("reshape", (a,), (str(math.prod(c.info(a).shape)),)) for a in data]
    if _op in FILLS:  # constant_pad_nd's number defaults to 0
        args = (*args, *[0] * (FILLS[_op] + 1 - len(args)))
        flat.append(c.constant(torch.tensor([args[FILLS[_op]]], dtype=c.info(data[0]).dtype)))
        args, start = (*args[:FILLS[_op]], start, *args[FILLS[_op] + 1:]), start + 1

    def value(a):
        if isinstance(a, Term) and id(a) not in at and not low.known(a):
            raise Unsupported("an index or mask that is not a constant")
        if isinstance(a, Term):
            return at[id(a)] if id(a) in at else c.params[a.attrs[0]]
        return [value(v) for v in a] if isinstance(a, (list, tuple)) else a
    if kwargs.get("accumulate") or _op == aten.index_put.default and True in args[3:]:  # it adds
        raise Unsupported("accumulated writes")
    try:
        index = _op(*(value(a) for a in args), **kwargs)
    except (RuntimeError, IndexError, ValueError) as e:
        raise Unsupported(f"the op refuses its positions: {e}") from e
    if not bool(((index >= 0) & (index < start) & (index == index.round())).all()):
        raise Unsupported("an element that is no operand's")
    pool = functools.reduce(lambda a, b: Term("concat", (a, b), (-1,)), flat)
    picked = Term("index_select", (pool, c.constant(index.long().reshape(-1))), (-1,))
    return Term("reshape", (picked,), (c.out_shape(),))


for _move in MOVES:
    lowers(_move)(functools.partial(_moved, _op=_move))
