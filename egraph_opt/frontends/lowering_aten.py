"""Lowering of ATen overloads, for programs traced by torch.export (models whose Python control
flow reads shapes): the same lowering functions as torch's own spellings, keyed by the overloads
export records, and adapters where an overload's arguments differ."""
from __future__ import annotations

import torch

from . import forms
from . import lowering as low
from . import lowering_nn as nn_low
from .lowering import Unsupported, lowers
from ..lang.term import Term

aten = torch.ops.aten

#  overload                                        the lowering of the torch spelling it matches
SAME = {
    aten.add.Tensor: low._binary("add"), aten.sub.Tensor: low._binary("sub"),
    aten.mul.Tensor: low._binary("mul"), aten.div.Tensor: low._binary("div"),
    aten.pow.Tensor_Scalar: low._binary("pow"), aten.pow.Tensor_Tensor: low._binary("pow"),
    aten.maximum.default: low._binary("maximum"), aten.minimum.default: low._binary("minimum"),
    **dict.fromkeys((aten.lt.Tensor, aten.lt.Scalar), low._binary("less")),
    **dict.fromkeys((aten.gt.Tensor, aten.gt.Scalar), low._greater),
    aten.atan2.default: low._binary("atan2"), aten.hypot.default: low._binary("hypot"),
    **dict.fromkeys((aten.view.default, aten.reshape.default, aten._unsafe_view.default,
                     aten.unsqueeze.default, aten.squeeze.dim, aten.flatten.using_ints), low.TABLE["view"]),
    aten.expand.default: low.TABLE["expand"], aten.transpose.int: low._transpose,
    aten.repeat_interleave.self_int: low._repeat_interleave,
    aten.permute.default: low._permute, aten.t.default: low._t,
    aten.matmul.default: low._matmul, aten.bmm.default: low._matmul, aten.mm.default: low._matmul,
    aten.cat.default: low._cat, aten.where.self: low._where, aten.clone.default: low._identity,
    aten.contiguous.default: low._identity, aten.alias.default: low._identity,
    aten.detach.default: low._identity, aten.eq.Scalar: low._eq,
    aten.masked_fill.Scalar: low._masked_fill, aten.where.ScalarOther: low._where,
    aten.where.ScalarSelf: low._where, aten.to.dtype: low._to, aten.sum.dim_IntList: low.TABLE["sum"],
    aten.mean.dim: low.TABLE["mean"], aten.amax.default: low._amax,
    aten.logsumexp.default: low._logsumexp, aten.gather.default: low.TABLE["gather"],
    aten.index_select.default: low.TABLE["index_select"],
    aten.scaled_dot_product_attention.default: nn_low._sdpa, aten.linear.default: nn_low._linear,
    aten.gelu.default: low._gelu, aten.conv2d.default: nn_low._conv2d,
    aten.max_pool2d.default: nn_low._max_pool2d, aten.split.Tensor: low._split,
    aten.split_with_sizes.default: low._split, aten.chunk.default: low._chunk,
    aten.dropout.default: low._dropout(True), aten.silu.default: low._silu,
}
for _op in ("exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "abs", "sin", "cos", "tanh",
            "sigmoid", "relu", "erf", "neg", "tan", "atan", "asinh", "acosh", "atanh"):
    SAME[getattr(aten, _op).default] = low.TABLE[getattr(torch, _op)]
for _overload, _fn in SAME.items():
    lowers(_overload)(_fn)


def _softmax(op: str):
    """softmax.int's third argument is a dtype, _softmax.default's a half-to-float flag."""
    return lambda c, x, dim, dtype_or_half=None: low._softmax_like(op)(
        c, x, dim, dtype=dtype_or_half if isinstance(dtype_or_half, torch.dtype) else None)


lowers(aten.softmax.int, aten._softmax.default)(_softmax("softmax"))
lowers(aten.log_softmax.int, aten._log_softmax.default)(_softmax("log_softmax"))


@lowers(aten.cross_entropy_loss.default)
def _cross_entropy(c, x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    return nn_low._class_loss("cross_entropy")(c, x, target, weight, reduction=reduction,
                                               ignore_index=ignore_index, label_smoothing=label_smoothing)


@lowers(aten.nll_loss.default, aten.nll_loss_nd.default)
def _nll_loss(c, x, target, weight=None, reduction=1, ignore_index=-100):
    return nn_low._class_loss("nll_loss")(c, x, target, weight, reduction=reduction, ignore_index=ignore_index)


@lowers(aten.nll_loss_forward.default)
def _nll_loss_forward(c, x, target, weight, reduction, ignore_index):
    """(loss, total weight): the loss is a Term, the weight stays with the opaque call."""
    return low.Parts((_nll_loss(c, x, target, weight, reduction, ignore_index), None))


@lowers(aten.addmm.default)
def _addmm(c, bias, m1, m2, *, beta=1, alpha=1):
    if beta != 1 or alpha != 1:
        raise Unsupported("addmm with beta or alpha")
    return Term("add", (Term("matmul", (c.tensor(m1), c.tensor(m2))), c.tensor(bias)))


@lowers(aten.baddbmm.default)
def _baddbmm(c, bias, b1, b2, *, beta=1, alpha=1):
    """bias + alpha (b1 @ b2): BLOOM's ALiBi scores. beta = 0 ignores the bias (NaN too): opaque."""
    if beta != 1:
        raise Unsupported("baddbmm with beta")
    scores = Term("matmul", (c.tensor(b1), c.tensor(b2)))
    if alpha != 1:
        scores = forms.binary("mul", scores, forms.constant(alpha, str(c.info(b1).dtype).removeprefix("torch.")))
    return forms.binary("add", scores, c.tensor(bias))


@lowers(aten.select.int)
def _select(c, x, dim, index):
    """``x[:, i]``: one slice along ``dim``, that axis dropped."""
    axis, size = c.axis(x, dim), c.info(x).shape[dim]
    if not -size <= index < size:
        raise Unsupported(f"index {index} out of range for size {size}")
    at = index % size
    return Term("reshape", (Term("slice", (x,), (axis, at, at + 1, 1)),), (c.out_shape(),))


@lowers(aten.layer_norm.default)
def _layer_norm(c, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return nn_low._layer_norm(c, x, normalized_shape, weight, bias, eps)


@lowers(aten.rms_norm.default)
def _rms_norm(c, x, normalized_shape, weight=None, eps=None):
    return nn_low._rms_norm(c, x, normalized_shape, weight, eps)


@lowers(aten.embedding.default)
def _embedding(c, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return nn_low._embedding(c, indices, weight)


@lowers(aten.full.default)
def _full(c, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    """A 0-d full of a number (GPT-2's scale and mask value) is that number as a const: as the
    other operand of a kernel, a 0-d tensor's value is read in the kernel's float32 or wider, so
    it acts as the number itself where the tensor's dtype holds it exactly and float32 does too."""
    if list(size) or not isinstance(fill_value, (int, float)) or isinstance(fill_value, bool) \
            or dtype is None or not dtype.is_floating_point:
        raise Unsupported("full of a shape, of a non-number, or of an implicit or integer dtype")
    value = torch.full((), fill_value, dtype=dtype).item()
    if value != fill_value or float(torch.tensor(value, dtype=torch.float32)) != value:
        raise Unsupported(f"{fill_value!r} is not exact in {dtype} and float32")
    return Term.const(float(value))


@lowers(aten._safe_softmax.default)
def _safe_softmax(c, x, dim, dtype=None):
    """softmax, but 0 across a row that is all -inf (torch.export's spelling inside attention)."""
    axis = c.axis(x, dim)
    x = low._cast(c, x, dtype) if dtype is not None else x
    return low.safe_rows(Term("max", (x,), (axis, True)), Term("softmax", (x,), (axis,)),
                         str(c.out.dtype).removeprefix("torch."))


@lowers(aten.slice.Tensor)
def _slice(c, x, dim=0, start=None, end=None, step=1):
    """``x[..., a:b]`` as torch.export records it, one axis at a time (rotate_half's halves)."""
    return low._getitem(c, x, (slice(None),) * (c.axis(x, dim) % c.rank(x)) + (slice(start, end, step),))


@lowers(aten.numpy_T.default)
def _numpy_t(c, x):
    """``x.T`` as torch.export records it: every axis reversed."""
    return low._permute(c, x, list(range(c.rank(x)))[::-1])

