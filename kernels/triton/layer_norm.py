"""Layer norm over the last dim, with optional affine weight and bias (``F.layer_norm``).

One program per row, three passes over the row in blocks: the mean, then the variance as the
mean of squared deviations (not E[x^2] - E[x]^2, which cancels catastrophically), then the
normalized, scaled output. Statistics are accumulated per lane in float32 and reduced once. A row past
2^32 in magnitude is normalized scaled by a power of two: its squares (or sum) could overflow float32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import ROW_CONFIGS, row_block
from .mathlib import deviations_step, moments_step, scaled_mean, scaled_rstd
from .runtime import implements, tuned


@triton.jit
def _layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n, eps, HAS_WEIGHT: tl.constexpr,
                       HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n
    acc = tl.zeros([BLOCK], tl.float32)
    low, top = acc, acc
    for start in tl.range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n, other=0.0).to(tl.float32)
        acc, low, top = moments_step(acc, low, top, x)
    mean, scale = scaled_mean(acc, low, top, n)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        acc = deviations_step(acc, tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32), mean, scale, mask)
    rstd = scaled_rstd(acc, n, eps, scale)
    for start in tl.range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        y = (tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) * scale - mean) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * n + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@implements("layer_norm", limits=lambda use: None if len(use.shapes) == 3 and all(use.shapes)
            else "affine parameters must be tensors", configs=ROW_CONFIGS)
def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float, *, config: dict | None = None) -> torch.Tensor:
    n = x.shape[-1]
    rows = x.contiguous().reshape(-1, n)
    out = torch.empty_like(rows)
    if rows.shape[0]:
        w, b = (x if t is None else t.contiguous() for t in (weight, bias))  # None: never read, x its pointer
        _layer_norm_kernel[(rows.shape[0],)](rows, w, b, out, n, float(eps), HAS_WEIGHT=weight is not None,
                                             HAS_BIAS=bias is not None,
                                             **tuned(config, ROW_CONFIGS, row_block, BLOCK=n))
    return out.reshape(x.shape)
