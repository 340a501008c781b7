"""Row-wise softmax, log_softmax and logsumexp: one kernel, an online max/sum over blocks. Pass 1 walks the row in
blocks keeping a running max ``m`` and a running sum ``s`` of ``exp(x - m)`` (rescaled when ``m`` grows), so rows of
any length cost one block of registers and never overflow. Pass 2 (not for logsumexp) writes the result."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import ROW_CONFIGS, row_block
from .mathlib import logsumexp_step, softmax_of
from .runtime import implements, tuned

SOFTMAX, LOG_SOFTMAX, LOGSUMEXP = 0, 1, 2


@triton.jit
def row_logsumexp(x_ptr, n, BLOCK: tl.constexpr):
    """(max, sum of exp(x - max)) of the ``n`` values at ``x_ptr``, in float32 (``logsumexp_step``)."""
    m, s = float("-inf"), 0.0
    for start in tl.range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + cols, mask=cols < n, other=float("-inf")).to(tl.float32)
        m, s = logsumexp_step(m, s, x)
    return m, s


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    """MODE is SOFTMAX (0), LOG_SOFTMAX (1) or LOGSUMEXP (2): one value per row."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n
    m, s = row_logsumexp(x_row, n, BLOCK)
    lse = tl.where(m == float("inf"), m, m + tl.log(s))  # +inf, where s is exp(inf - inf): NaN
    if MODE == 2:
        tl.store(out_ptr + row, lse.to(out_ptr.dtype.element_ty))
    else:
        for start in tl.range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            if MODE == 0:
                y = softmax_of(x, m, s)
            else:  # a row whose max is +inf: NaN at +inf, -inf elsewhere (ops.log_softmax)
                y = tl.where(m == float("inf"), tl.where(x == float("inf"), float("nan"), float("-inf")), x - lse)
            tl.store(out_ptr + row * n + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, axis: int, mode: int, config: dict | None) -> torch.Tensor:
    """The kernel over the contiguous rows of ``x`` with ``axis`` moved last; the result moved back."""
    moved = x.movedim(axis, -1).contiguous()
    rows, n = moved.reshape(-1, moved.shape[-1]), moved.shape[-1]
    out = torch.empty(moved.shape[:-1] + (1 if mode == LOGSUMEXP else n,), dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        _softmax_kernel[(rows.shape[0],)](rows, out, n, MODE=mode, **tuned(config, ROW_CONFIGS, row_block, BLOCK=n))
    return out.movedim(-1, axis)


@implements("softmax", configs=ROW_CONFIGS)
def softmax(x: torch.Tensor, axis: int, *, config: dict | None = None) -> torch.Tensor:
    return _launch(x, axis, SOFTMAX, config)


@implements("log_softmax", configs=ROW_CONFIGS)
def log_softmax(x: torch.Tensor, axis: int, *, config: dict | None = None) -> torch.Tensor:
    return _launch(x, axis, LOG_SOFTMAX, config)


@implements("logsumexp", configs=ROW_CONFIGS)
def logsumexp(x: torch.Tensor, axis: int, keepdim: bool, *, config: dict | None = None) -> torch.Tensor:
    out = _launch(x, axis, LOGSUMEXP, config)
    return out if keepdim else out.squeeze(axis)
