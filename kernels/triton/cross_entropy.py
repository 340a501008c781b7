"""Cross entropy of logits against class indices: log_softmax and NLL fused, mean over rows.

Each program computes its row's ``logsumexp(x) - x[target]`` with the online pass of the softmax
kernel, so the (rows, classes) log-probabilities are never written. Rows whose target is
``ignore_index`` count neither in the sum nor in the mean; a target outside the classes makes
that row's loss NaN instead of reading out of bounds (torch raises; a kernel cannot, cheaply).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import row_block
from .softmax import row_logsumexp


@triton.jit
def _cross_entropy_kernel(x_ptr, target_ptr, loss_ptr, n, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n
    target = tl.load(target_ptr + row)
    in_range = (target >= 0) & (target < n)
    m, s = row_logsumexp(x_row, n, BLOCK)
    x_t = tl.load(x_row + tl.where(in_range, target, 0)).to(tl.float32)
    loss = tl.where(in_range, m + tl.log(s) - x_t, float("nan"))
    tl.store(loss_ptr + row, tl.where(target == ignore_index, 0.0, loss))


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100
                  ) -> torch.Tensor:
    """``F.cross_entropy(logits, target, ignore_index=..., reduction='mean')``: classes on dim 1
    (or dim 0 for a single unbatched row), as torch lays them out."""
    class_dim = 1 if logits.dim() > 1 else 0
    n = logits.shape[class_dim]
    rows = logits.movedim(class_dim, -1).contiguous().reshape(-1, n)
    flat_target = target.contiguous().reshape(-1)
    losses = torch.empty(rows.shape[0], dtype=torch.float32, device=logits.device)
    if rows.shape[0]:
        _cross_entropy_kernel[(rows.shape[0],)](rows, flat_target, losses, n, int(ignore_index),
                                                BLOCK=row_block(n))
    counted = (flat_target != ignore_index).sum()
    return (losses.sum() / counted).to(logits.dtype)
