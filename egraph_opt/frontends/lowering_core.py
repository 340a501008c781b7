"""The Core ATen opset (ops tagged ``torch.Tag.core``), which torch's decompositions reach: each
overload lowers here or in ``lowering_aten``, is a constant of the signature (folded at capture),
or is named in ``OPAQUE`` with the reason it stays a call. Exact compositions of the Term
language's ops only: an op with no exact form raises ``Unsupported`` for those operands."""
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

#: values of shapes and constants alone: computed once per signature (``lowering._fold``)
FOLDED = {aten.arange.start_step, aten.full.default, aten.full_like.default, aten.fill.Scalar,
          aten.scalar_tensor.default, aten.sym_size.int, aten.sym_numel.default}
_NO_TERM = "no op of the Term language computes it"
#: core overloads that stay calls, and why
OPAQUE = {
    **dict.fromkeys((aten.rand.default, aten.randn.default, aten.randperm.default),
                    "draws random numbers: the program runs untouched"),
    **dict.fromkeys((aten.empty.memory_format, aten.empty_strided.default),
                    "uninitialized memory: no value"),
    **dict.fromkeys((aten.as_strided.default, aten.sym_stride.int, aten.sym_storage_offset.default),
                    "reads memory layout (strides, storage offset), not values"),
    aten._local_scalar_dense.default: "reads a tensor's value on the host (.item())",
    aten.nonzero.default: "its shape depends on its operand's values",
    aten.atan2.out: "writes its out= argument (atan2.default is lowered)",
    **dict.fromkeys((aten._adaptive_avg_pool2d_backward.default, aten.avg_pool2d_backward.default,
                     aten.convolution_backward.default, aten.embedding_dense_backward.default,
                     aten.max_pool2d_with_indices_backward.default,
                     aten.native_group_norm_backward.default, aten.native_layer_norm_backward.default),
                    "a gradient: capture lowers forward programs, autograd stays torch's"),
    **dict.fromkeys((aten._fft_c2r.default, aten._fft_r2c.default), "complex values: the Term language is real"),
    **dict.fromkeys((aten.sort.default, aten.topk.default, aten.argmax.default, aten.argmin.default,
                     aten.cumsum.default, aten.prod.default, aten.prod.dim_int, aten.index_put.default,
                     aten.masked_scatter.default, aten.grid_sampler_2d.default, aten.upsample_bilinear2d.vec,
                     aten.col2im.default, aten._pdist_forward.default, aten._embedding_bag.default,
                     aten.max_pool3d_with_indices.default),
                    _NO_TERM),
}


def _scalar(op: str):
    """The overload whose other operand is a Python number (``aten.mul.Scalar``)."""
    return lambda c, a, b, alpha=1: low._binary(op)(c, a, b, alpha=alpha)


for _op in ("add", "sub", "mul", "div"):
    lowers(getattr(aten, _op).Scalar)(_scalar(_op))
lowers(aten.pow.Scalar)(low._binary("pow"))
for _op in ("fmod", "remainder"):
    lowers(getattr(aten, _op).Tensor, getattr(aten, _op).Scalar)(low._binary(_op))
for _op in ("floor", "ceil", "round", "trunc", "asin", "acos", "sinh", "cosh", "log2", "log10"):
    lowers(getattr(aten, _op).default)(low.TABLE[getattr(torch, _op)])
lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)(low._binary("div"))  # rounding_mode None only
lowers(aten.isnan.default)(low.TABLE[torch.isnan])
lowers(aten.bitwise_not.default)(low._invert)
lowers(aten.clamp.default, aten.clamp.Tensor)(low._clamp)
lowers(aten.hardtanh.default)(lambda c, x, min_val=-1.0, max_val=1.0: low._clamp(c, x, min_val, max_val))
lowers(aten.squeeze.dims)(low.TABLE["view"])
lowers(aten.mean.default)(lambda c, x, *, dtype=None: low._reduce("mean", c, x, None, False, dtype))
lowers(aten.var.correction, aten.var.dim)(low._var)
lowers(aten.max.dim)(low._max)
lowers(aten.alias.default)(low._identity)


def _bool(c, x) -> Term:
    """``x != 0`` (NaN included) as a bool tensor: what the logical ops read."""
    return x if c.info(x).dtype == torch.bool else Term("cast", (c.tensor(x),), ("bool",))


def _any_of(*masks: Term) -> Term:
    return functools.reduce(lambda a, b: Term("maximum", (a, b)), masks)  # or, of bools


def _unequal(c, a, b) -> Term:
    """``a != b``: one is below the other, or one is NaN (a constant never is)."""
    a, b = low._operand(c, a, b), low._operand(c, b, a)
    return _any_of(Term("less", (a, b)), Term("less", (b, a)),
                   *(Term("isnan", (t,)) for t in (a, b) if t.op != "const" and c.floating(t)))


def _not_above(c, a, b) -> Term:
    """``a <= b``: neither b < a nor a NaN."""
    a, b = low._operand(c, a, b), low._operand(c, b, a)
    return Term("logical_not", (_any_of(Term("less", (b, a)), *(
        Term("isnan", (t,)) for t in (a, b) if t.op != "const" and c.floating(t))),))


def _eq(c, a, b):
    if isinstance(b, (int, float)) and not isinstance(b, bool) and b == 0:
        return low._eq(c, a, b)  # the form the rules know
    return Term("logical_not", (_unequal(c, a, b),))


lowers(aten.ne.Scalar, aten.ne.Tensor)(_unequal)
lowers(aten.eq.Tensor, aten.eq.Scalar)(_eq)
lowers(aten.le.Scalar, aten.le.Tensor)(_not_above)
lowers(aten.ge.Scalar, aten.ge.Tensor)(lambda c, a, b: _not_above(c, b, a))


def _logical(op: str, bits: bool):
    """and / or / xor of truth values (bitwise of bools is logical; of integers, bits: opaque)."""
    def lower(c, a, b):
        if bits and not (c.info(a).dtype == torch.bool and isinstance(b, Term) and c.info(b).dtype == torch.bool):
            raise Unsupported("bitwise op of integers")
        a, b = _bool(c, a), _bool(c, b)
        return _unequal(c, a, b) if op == "xor" else Term(op, (a, b))
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


@lowers(aten.isinf.default)
def _isinf(c, x):
    """|x| above the dtype's largest finite number (NaN is not)."""
    top = forms.constant(torch.finfo(c.info(_floating(c, x)).dtype).max, str(c.info(x).dtype)[6:])
    return Term("less", (top, Term("abs", (x,))))


@lowers(aten.sign.default)
def _sign(c, x):
    """(0 < x) - (x < 0), as torch computes it: 0 at NaN and at either zero."""
    dtype = str(c.info(_floating(c, x)).dtype)[6:]
    zero = Term.const(0.0)
    return Term("sub", (Term("cast", (Term("less", (zero, x)),), (dtype,)),
                        Term("cast", (Term("less", (x, zero)),), (dtype,))))


@lowers(aten.leaky_relu.default)
def _leaky_relu(c, x, negative_slope=0.01):
    return Term("where", (Term("less", (Term.const(0.0), x)), x,
                          forms.binary("mul", _floating(c, x), low._operand(c, negative_slope, x))))


@lowers(aten.elu.default)
def _elu(c, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """x > 0 ? x scale : expm1(x input_scale) (alpha scale), torch's formula; a factor 1 is exact."""
    def times(t, k):
        return t if k == 1 else forms.binary("mul", t, low._operand(c, k, x))
    negative = times(Term("expm1", (times(_floating(c, x), input_scale),)), alpha * scale)
    return Term("where", (Term("less", (Term.const(0.0), x)), times(x, scale), negative))


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
    """The mean over each window of non-overlapping windows that tile the spatial axes (from 2)."""
    shape = tuple(c.info(x).shape)
    spatial, out = shape[2:], x
    for axis, (n, k) in enumerate(zip(spatial, kernel)):
        if n % k:
            out = Term("slice", (out,), (axis - len(spatial), 0, n - n % k, 1))
    split = shape[:2] + sum(((n // k, k) for n, k in zip(spatial, kernel)), ())
    return forms.reduce("mean", Term("reshape", (out,), (shape_attr(split),)),
                        range(3, len(split), 2), len(split), False)


@lowers(aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(c, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    kernel = list(kernel_size) * (c.rank(x) - 2 if len(kernel_size) == 1 else 1)
    if list(stride or kernel) != kernel or any(padding if isinstance(padding, (list, tuple)) else [padding]) \
            or ceil_mode or divisor_override:
        raise Unsupported("overlapping, padded or ceil-mode windows")
    return _window_mean(c, x, kernel)


@lowers(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool(c, x, output_size):
    spatial = c.info(x).shape[2:]
    if any(n % o for n, o in zip(spatial, output_size)):
        raise Unsupported("windows of unequal sizes")
    return _window_mean(c, x, [n // o for n, o in zip(spatial, output_size)])


@lowers(aten.constant_pad_nd.default)
def _constant_pad(c, x, pad, value=0):
    """Blocks of ``value`` concatenated on each side of each axis (a negative pad is a slice)."""
    out, shape = x, list(c.info(x).shape)
    for i in range(len(pad) // 2):
        axis, (left, right) = -1 - i, pad[2 * i:2 * i + 2]
        if left < 0 or right < 0:
            out = Term("slice", (out,), (axis, max(-left, 0), shape[axis] - max(-right, 0), 1))
            shape[axis] -= max(-left, 0) + max(-right, 0)
        for width, first in ((left, True), (right, False)):
            if width > 0:
                block = c.constant(torch.full(shape[:axis] + [width] + shape[len(shape) + axis + 1:],
                                              value, dtype=c.info(x).dtype))
                out = Term("concat", (block, out) if first else (out, block), (axis,))
                shape[axis] += width
    return out


def _indexed(c, x, axis: int, index: list[int]) -> Term:
    """x at ``index`` along ``axis``: flips, reflections and replications of edges."""
    return Term("index_select", (x, c.constant(torch.tensor(index))), (axis,))


def _padded(reflect: bool):
    def lower(c, x, padding):
        out = x
        for i in range(len(padding) // 2):
            left, right = padding[2 * i:2 * i + 2]
            n = c.info(x).shape[-1 - i]
            inner = list(range(n))
            if reflect:
                index = inner[left:0:-1] + inner + inner[-2:-2 - right:-1]
            else:
                index = [0] * left + inner + [n - 1] * right
            if min(left, right) < 0 or len(index) != n + left + right:
                raise Unsupported("a negative or too wide pad")
            out = _indexed(c, out, -1 - i, index)
        return out
    return lower


lowers(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)(_padded(True))
lowers(aten.replication_pad2d.default, aten.replication_pad3d.default)(_padded(False))


@lowers(aten.flip.default)
def _flip(c, x, dims):
    out = x
    for d in dims:
        out = _indexed(c, out, c.axis(x, d), list(range(c.info(x).shape[d]))[::-1])
    return out


@lowers(aten.repeat.default)
def _repeat(c, x, repeats):
    """Each axis tiled: a new axis of ``r`` before it, expanded, merged."""
    shape = (1,) * (len(repeats) - c.rank(x)) + tuple(c.info(x).shape)
    ones = sum(((1, n) for n in shape), ())
    wide = sum(((r, n) for r, n in zip(repeats, shape)), ())
    return Term("reshape", (Term("expand", (Term("reshape", (x,), (shape_attr(ones),)),),
                                 (shape_attr(wide),)),), (c.out_shape(),))


@lowers(aten.upsample_nearest2d.vec)
def _upsample_nearest(c, x, output_size, scale_factors=None):
    """Whole-number factors: each pixel expanded into its block."""
    shape = tuple(c.info(x).shape)
    out = tuple(c.out.shape)
    if any(o % n for o, n in zip(out[2:], shape[2:])):
        raise Unsupported("a factor that is not a whole number")
    ones = shape[:2] + sum(((n, 1) for n in shape[2:]), ())
    wide = shape[:2] + sum(((n, o // n) for n, o in zip(shape[2:], out[2:])), ())
    return Term("reshape", (Term("expand", (Term("reshape", (x,), (shape_attr(ones),)),),
                                 (shape_attr(wide),)),), (c.out_shape(),))


@lowers(aten.diagonal.default)
def _diagonal(c, x, offset=0, dim1=0, dim2=1):
    """The diagonal as a strided slice of the two axes merged, moved last."""
    rank, shape = c.rank(x), c.info(x).shape
    a, b = dim1 % rank, dim2 % rank
    n, m = shape[a], shape[b]
    length = max(0, min(n, m - offset) if offset >= 0 else min(n + offset, m))
    if not length or a == b:
        raise Unsupported("an empty diagonal")
    rest = [d for d in range(rank) if d not in (a, b)]
    moved = forms.permute(x, rest + [a, b], rank)
    flat = Term("reshape", (moved,), (shape_attr([shape[d] for d in rest] + [n * m]),))
    start = offset if offset >= 0 else -offset * m
    return Term("slice", (flat,), (-1, start, start + (length - 1) * (m + 1) + 1, m + 1))


@lowers(aten.slice_scatter.default)
def _slice_scatter(c, x, src, dim=0, start=None, end=None, step=1):
    """x with its slice ``start:end`` along ``dim`` replaced by ``src``: three pieces concatenated."""
    n = c.info(x).shape[dim]
    start, end, step = slice(start, end, step).indices(n)
    if step != 1:
        raise Unsupported("a strided slice")
    axis, out = c.axis(x, dim), c.tensor(src)
    if start > 0:
        out = Term("concat", (Term("slice", (x,), (axis, 0, start, 1)), out), (axis,))
    if end < n:
        out = Term("concat", (out, Term("slice", (x,), (axis, end, n, 1))), (axis,))
    return out


@lowers(aten.select_scatter.default)
def _select_scatter(c, x, src, dim, index):
    shape = list(c.info(x).shape)
    shape[dim] = 1
    one = Term("reshape", (c.tensor(src),), (shape_attr(shape),))
    c.info_of[id(one)] = type(c.out)(tuple(shape), c.info(src).dtype)
    index %= c.info(x).shape[dim]
    return _slice_scatter(c, x, one, dim, index, index + 1)


@lowers(aten.index.Tensor)
def _index(c, x, indices):
    """x[i, j] over adjacent axes, the indices constants (a pad's, an upsampling's): one
    index_select of those axes merged, at the flat indices computed here."""
    axes = [d for d, i in enumerate(indices) if i is not None]
    if not axes or axes != list(range(axes[0], axes[0] + len(axes))) \
            or not all(isinstance(indices[d], Term) and indices[d].op == "param" and indices[d].attrs[0]
                       .startswith((low.CONSTANT, "_tensor_constant")) for d in axes):
        raise Unsupported("indices that are not constants, or on axes apart")
    shape, first, last = tuple(c.info(x).shape), axes[0], axes[-1] + 1
    flat = 0
    for d in axes:
        value = c.params[indices[d].attrs[0]]
        if value.dtype not in (torch.int64, torch.int32) or not bool(((value >= -shape[d]) & (value < shape[d])).all()):
            raise Unsupported("an index that is not an integer in range")
        flat = flat * shape[d] + value.long() % shape[d]
    merged = Term("reshape", (x,), (shape_attr(shape[:first] + (math.prod(shape[first:last]),) + shape[last:]),))
    picked = Term("index_select", (merged, c.constant(flat.reshape(-1))), (first - (len(shape) - len(axes) + 1),))
    return Term("reshape", (picked,), (c.out_shape(),))


def _scattered(c, x, dim, index):
    """Where a constant ``index`` writes along ``dim`` (a bool mask of x's shape), and from which
    of its positions (gather's index into the source): each position written at most once."""
    if not low._constant(index) and not (isinstance(index, Term) and index.op == "param"
                                         and index.attrs[0].startswith("_tensor_constant")):
        raise Unsupported("an index that is not a constant")
    value, shape = c.params[index.attrs[0]].long(), tuple(c.info(x).shape)
    if not bool(((value >= 0) & (value < shape[dim])).all()):
        raise Unsupported("an index out of range")
    counts = torch.zeros(shape, dtype=torch.long).scatter_add_(dim, value, torch.ones_like(value))
    if int(counts.max()) > 1:
        raise Unsupported("a position written twice: the order of writes decides")
    at = torch.arange(value.shape[dim]).reshape([-1 if d == dim % len(shape) else 1 for d in range(len(shape))])
    source = torch.zeros(shape, dtype=torch.long).scatter_(dim, value, at.expand(value.shape).contiguous())
    return c.constant(counts.bool()), c.constant(source)


def _from_source(c, x, dim, src, source: Term) -> Term:
    if any(s < n for d, (s, n) in enumerate(zip(c.info(src).shape, c.info(x).shape)) if d != dim % c.rank(x)):
        raise Unsupported("a source narrower than the tensor it scatters into")
    return Term("gather", (c.tensor(src), source), (c.axis(x, dim),))


@lowers(aten.scatter.value, aten.scatter.src, aten.scatter_add.default)
def _scatter(c, x, dim, index, src, *, reduce=None, _add=False):
    """x with the positions a constant index names replaced by src (or by the value)."""
    written, source = _scattered(c, x, dim, index)
    if reduce is not None:
        raise Unsupported("scatter with reduce")
    new = low._operand(c, src, x) if not isinstance(src, Term) else _from_source(c, x, dim, src, source)
    return Term("where", (written, Term("add", (x, new)) if _add else new, x))


lowers(aten.scatter_add.default)(lambda c, x, dim, index, src: _scatter(c, x, dim, index, src, _add=True))


@lowers(aten.scatter_reduce.two)
def _scatter_reduce(c, x, dim, index, src, reduce, include_self=True):
    ops = {"sum": "add", "prod": "mul", "amax": "maximum", "amin": "minimum"}
    if reduce not in ops or not include_self:
        raise Unsupported(f"scatter_reduce {reduce!r} or without self")
    written, source = _scattered(c, x, dim, index)
    return Term("where", (written, Term(ops[reduce], (x, _from_source(c, x, dim, src, source))), x))


def _batch_stats(c, x, weight, bias, eps):
    """(x - mean) rsqrt(var + eps) over every axis but the channels (axis 1), biased variance,
    and the per-channel affine: batch norm in training, as torch computes its output."""
    shape, rank = tuple(c.info(x).shape), c.rank(x)
    if any(d == 0 for d in shape):
        raise Unsupported("an empty batch")
    channels = Term("reshape", (forms.permute(x, [1, 0, *range(2, rank)], rank),),
                    (shape_attr((shape[1], math.prod(shape) // shape[1])),))
    column = shape_attr((1, shape[1]) + (1,) * (rank - 2))
    mean = Term("reshape", (Term("mean", (channels,), (-1, True)),), (column,))
    var = Term("reshape", (Term("var", (channels,), (-1, True, 0)),), (column,))
    rstd = Term("rsqrt", (forms.binary("add", var, forms.constant(eps, str(c.info(x).dtype)[6:])),))
    out = Term("mul", (Term("sub", (x, mean)), rstd))
    for t, op in ((weight, "mul"), (bias, "add")):
        out = out if t is None else Term(op, (out, Term("reshape", (t,), (column,))))
    flat = shape_attr((shape[1],))
    return Parts((out, Term("reshape", (mean,), (flat,)), Term("reshape", (rstd,), (flat,))))


lowers(aten._native_batch_norm_legit.default, aten.native_batch_norm.default)(
    lambda c, x, w, b, running_mean, running_var, training, momentum, eps: _batch_stats(c, x, w, b, eps)
    if training else Parts((Term("batch_norm", (x, running_mean, running_var, w, b), (float(eps),)), None, None)))
lowers(aten._native_batch_norm_legit.no_stats)(
    lambda c, x, w, b, training, momentum, eps: _batch_stats(c, x, w, b, eps))


@lowers(aten._cdist_forward.default)
def _cdist(c, x1, x2, p, compute_mode=None):
    """(sum |x1_i - x2_j|^p)^(1/p) over the last axis, p 1 or 2 (their own kernels' formulas)."""
    if p not in (1.0, 2.0) or c.rank(x1) != c.rank(x2):
        raise Unsupported("a p-norm other than 1 and 2")
    s1, s2 = tuple(c.info(x1).shape), tuple(c.info(x2).shape)
    a = Term("reshape", (x1,), (shape_attr(s1[:-1] + (1, s1[-1])),))
    b = Term("reshape", (x2,), (shape_attr(s2[:-2] + (1,) + s2[-2:]),))
    d = Term("sub", (a, b))
    total = Term("sum", (Term("abs", (d,)) if p == 1 else Term("mul", (d, d)),), (-1, False))
    return total if p == 1 else Term("sqrt", (total,))
