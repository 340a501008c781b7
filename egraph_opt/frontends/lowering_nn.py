"""Lowering of torch.nn.functional's composite ops and of leaf modules: the fused ops of the Term language that users
reach through nn (embedding, layer norm, linear, attention, conv, pooling, batch norm), registered when imported."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .lowering import MODULES, Unsupported, lowers, safe_rows
from ..lang.ops import shape_attr
from ..lang.term import Term


@lowers(F.embedding)
def _embedding(c, ids, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    if max_norm is not None:
        raise Unsupported("embedding with max_norm renormalizes the weight")
    flat = Term("reshape", (ids,), (shape_attr((math.prod(c.info(ids).shape),)),))
    return Term("reshape", (Term("index_select", (weight, flat), (-2,)),), (c.out_shape(),))


@lowers(F.layer_norm, torch.layer_norm)  # ATen's adds cudnn_enable
def _layer_norm(c, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    if len(normalized_shape) != 1 or weight is None or bias is None:
        raise Unsupported("layer_norm over several axes or without affine parameters")
    return Term("layer_norm", (x, weight, bias), (float(eps),))


@lowers(F.rms_norm, torch.rms_norm)
def _rms_norm(c, x, normalized_shape, weight=None, eps=None):
    """eps None is the dtype's machine epsilon, as torch defines it."""
    if len(normalized_shape) != 1:
        raise Unsupported("rms_norm over several axes")
    eps = torch.finfo(c.info(x).dtype).eps if eps is None else eps
    return Term("rms_norm", (x, weight if weight is not None else Term.const(1.0)), (float(eps),))


@lowers(F.linear)
def _linear(c, x, weight, bias=None):
    return Term("linear", (x, weight, bias)) if bias is not None else \
        Term("matmul", (x, Term("transpose", (weight,), (-2, -1))))


@lowers(F.scaled_dot_product_attention)
def _sdpa(c, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p or (attn_mask is not None and is_causal):  # grouped heads: the op's own (ops.groups)
        raise Unsupported("attention with dropout, or both a mask and causality")
    scale = 1.0 / math.sqrt(c.info(q).shape[-1]) if scale is None else scale
    if attn_mask is None:
        return Term("sdpa", (q, k, v), (float(scale), bool(is_causal)))
    # torch's kernel gives 0 for a query whose every key is masked (a left-padded row), as _safe_softmax does;
    # sdpa_masked, the spelled softmax's NaN there. True attends: a bias of 0 / -inf, whose row maximum is below 0
    if c.info(attn_mask).dtype == torch.bool:  # where no key is kept
        bias = Term("where", (attn_mask, Term.const(0.0), Term.const(float("-inf"))))
        dead = Term("less", (Term("max", (bias,), (-1, True)), Term.const(0.0)))
        return Term("where", (dead, Term.const(0.0), Term("sdpa_masked", (q, k, v, bias), (float(scale),))))
    return safe_rows(Term("max", (attn_mask,), (-1, True)), Term("sdpa_masked", (q, k, v, attn_mask), (float(scale),)),
                     str(c.info(q).dtype).removeprefix("torch."))  # the output's


REDUCTIONS = ("none", "mean", "sum")  #: torch's reduction names; ATen's overloads number them


def _class_loss(op: str):
    """F.nll_loss and F.cross_entropy over class indices, unweighted: anything else (class weights,
    label smoothing, probability targets, legacy size_average/reduce) stays an opaque call."""
    def lower(c, x, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
              reduction="mean", label_smoothing=0.0):
        reduction = REDUCTIONS[reduction] if isinstance(reduction, int) else reduction
        if weight is not None or size_average is not None or reduce is not None or label_smoothing \
                or reduction not in REDUCTIONS or c.floating(target) or c.rank(x) < 2:
            raise Unsupported(f"{op} with weights, smoothing, probabilities or one sample")
        return Term(op, (c.tensor(x), target), (reduction, int(ignore_index)))
    return lower


lowers(F.nll_loss)(_class_loss("nll_loss"))
lowers(F.cross_entropy)(_class_loss("cross_entropy"))


def _pair(v) -> str:
    """Per spatial dim: torch takes an int or a one-element sequence for both."""
    v = (v,) if isinstance(v, int) else tuple(v)
    return shape_attr(v * 2 if len(v) == 1 else v)


@lowers(F.conv2d)
def _conv2d(c, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if isinstance(padding, str):
        raise Unsupported("padding by name")
    return Term("conv2d", (c.tensor(x), c.tensor(weight), c.tensor(bias) if bias is not None else Term.const(0.0)),
                (_pair(stride), _pair(padding), _pair(dilation), int(groups)))


@lowers(F.max_pool2d, F._max_pool2d, torch.max_pool2d)
def _max_pool2d(c, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """fx records F.max_pool2d's wrapper: its default stride (the kernel) is None, [] in torch's and ATen's forms."""
    if ceil_mode or return_indices:
        raise Unsupported("max_pool2d with ceil_mode or return_indices")
    return Term("max_pool2d", (c.tensor(x),), (_pair(kernel_size), _pair(stride or kernel_size),
                                                _pair(padding), _pair(dilation)))


@lowers(F.batch_norm)
def _batch_norm(c, x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    if training or weight is None or bias is None or running_mean is None:
        raise Unsupported("batch norm in training mode or without affine parameters")
    return Term("batch_norm", (x, running_mean, running_var, weight, bias), (float(eps),))


@lowers(torch.nn.modules.batchnorm._BatchNorm, table=MODULES)  # a leaf module
def _batch_norm_module(c, module, qualname, x):
    """BatchNorm's forward checks input.dim() in Python, which symbolic tracing cannot follow."""
    if module.training or not module.track_running_stats or not module.affine:
        raise Unsupported("batch norm in training mode or without running statistics")
    stats = [c.param(f"{qualname}.{name}", getattr(module, name))
             for name in ("running_mean", "running_var", "weight", "bias")]
    return Term("batch_norm", (x, *stats), (float(module.eps),))
