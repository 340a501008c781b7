"""Lowering of ATen overloads (programs traced by torch.export) whose arguments differ from those of the torch spelling
of their name (``lowering.lowering_of``): adapters to that spelling's lowering."""
from __future__ import annotations

import torch

from . import forms, lowering as low, lowering_nn as nn_low
from .lowering import Unsupported, lowers
from ..lang.ops import shape_attr
from ..lang.term import Term

aten = torch.ops.aten


def _loss(op: str):
    """ATen's spelling of a loss: its reduction a number, no legacy arguments."""
    def lower_loss(c, x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
        return nn_low._class_loss(op)(c, x, target, weight, reduction=reduction, ignore_index=ignore_index,
                                      label_smoothing=label_smoothing)
    return lower_loss


lowers(aten.cross_entropy_loss.default)(_loss("cross_entropy"))
lowers(aten.nll_loss.default, aten.nll_loss_nd.default)(_loss("nll_loss"))
lowers(aten.nll_loss_forward.default)(  # (loss, total weight): the weight stays with the opaque call
    lambda c, *args: low.Parts((_loss("nll_loss")(c, *args), None)))


@lowers(aten.addmm.default)
def _addmm(c, bias, m1, m2, *, beta=1, alpha=1):
    """bias + m1 @ m2; with other scales, a refusal (None)."""
    return Term("add", (Term("matmul", (c.tensor(m1), c.tensor(m2))), c.tensor(bias))) if beta == alpha == 1 else None


@lowers(aten.select.int)
def _select(c, x, dim, index):
    """``x[:, i]``: one slice along ``dim``, that axis dropped."""
    at = index % c.info(x).shape[dim]  # in range: the traced run read it
    return Term("reshape", (_slice(c, x, dim, at, at + 1),), (c.out_shape(),))


@lowers(aten.index.Tensor)
def _index(c, x, indices):
    """``x[..., [i, j], :]``: one axis indexed by constant integers (Falcon's MQA heads), a slice where they step evenly
    (a view: under autograd nothing scattered back), else one gather on that axis, not a table of every element."""
    (at,) = [i for i, t in enumerate(indices) if t is not None]  # one axis, else (ValueError) _affine's gather
    index = c.params[indices[at].attrs[0]] if low.known(indices[at]) else torch.zeros(0)
    if index.dim() != 1 or index.dtype not in (torch.int32, torch.int64) or not index.numel():
        return None
    i = (index % c.info(x).shape[at]).tolist()
    step = i[1] - i[0] if len(i) > 1 else 1
    return _slice(c, x, at, i[0], i[-1] + 1, step) if step > 0 and i == list(range(i[0], i[-1] + 1, step)) else \
        Term("index_select", (x, c.constant(torch.tensor(i))), (c.axis(x, at),))


lowers(aten.embedding.default)(lambda c, weight, ids, *options: nn_low._embedding(c, ids, weight))


@lowers(aten._safe_softmax.default)
def _safe_softmax(c, x, dim, dtype=None):
    """softmax, but 0 across a row that is all -inf (torch.export's spelling inside attention)."""
    axis, x = c.axis(x, dim), low._cast(c, x, dtype) if dtype is not None else x
    return low.safe_rows(Term("max", (x,), (axis, True)), Term("softmax", (x,), (axis,)),
                         str(c.out.dtype).removeprefix("torch."))


@lowers(aten.slice.Tensor)
def _slice(c, x, dim=0, start=None, end=None, step=1):
    """``x[..., a:b]`` as torch.export records it, one axis at a time (rotate_half's halves)."""
    axis, size = c.axis(x, dim), c.info(x).shape[dim]
    start, end, step = slice(start, end, step).indices(size)
    return x if (start, end, step) == (0, size, 1) else Term("slice", (x,), (axis, start, end, step))


def _spliced(c, base, src, axis: int, start: int, stop: int, step: int = 1):
    """``base`` with ``src`` in place of its [start, stop) along ``axis``: concats of its other slices (as one gather,
    the general form, it copied every element through an index: RWKV's time loop writes a step at a time)."""
    size = c.info(base).shape[axis]
    if step != 1 or stop <= start:
        raise Unsupported("a strided or empty scatter")
    parts = [Term("slice", (base,), (axis, 0, start, 1))] * (start > 0) + [src] + \
        [Term("slice", (base,), (axis, stop, size, 1))] * (stop < size)
    return forms.concat(parts, axis)


lowers(aten.slice_scatter.default, torch.slice_scatter)(lambda c, base, src, dim=0, start=None, end=None, step=1:
                                                        _spliced(c, base, src, c.axis(base, dim), *slice(
                                                            start, end, step).indices(c.info(base).shape[dim])))


@lowers(aten.copy.default)
def _copy(c, into, src, non_blocking=False):
    """``into`` holding ``src``'s values (``into.copy_(src)`` functionalized): ``src`` where shape and dtype agree."""
    if tuple(c.info(src).shape) != tuple(c.info(into).shape) or c.info(src).dtype != c.info(into).dtype:
        raise Unsupported("a copy that broadcasts or casts")
    return src


@lowers(aten.select_scatter.default, torch.select_scatter)
def _select_scatter(c, base, src, dim, index):
    axis, shape = c.axis(base, dim), list(c.info(base).shape)
    index, shape[axis] = index % shape[axis], 1
    return _spliced(c, base, Term("reshape", (src,), (shape_attr(tuple(shape)),)), axis, index, index + 1)


lowers(aten.native_dropout.default)(  # (x, its mask of ones) outside training or with p = 0: the mask stays a call
    lambda c, x, p, train: low.Parts((low._dropout(True)(c, x, p, bool(train)), None)))

lowers(aten._scaled_dot_product_flash_attention_for_cpu.default)(  # F.sdpa on CPU below autograd (make_fx)
    lambda c, q, k, v, p=0.0, causal=False, **kw: low.Parts((nn_low._sdpa(c, q, k, v, dropout_p=p, is_causal=causal,
                                                                          **kw), None)))
lowers(torch.batch_norm)(lambda c, x, w, b, m, v, t, mo, eps, *_: nn_low._batch_norm(c, x, m, v, w, b, t, mo, eps))
lowers(aten._native_batch_norm_legit_no_training.default)(lambda c, x, w, b, mean, var, momentum, eps: low.Parts(
    (nn_low._batch_norm(c, x, mean, var, w, b, False, momentum, eps), None, None)))  # its statistics stay a call


@lowers(aten.convolution.default)
def _convolution(c, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed or c.rank(x) != 4:
        raise Unsupported("a transposed convolution, or not over two spatial axes")
    return nn_low._conv2d(c, x, weight, bias, stride, padding, dilation, groups)
