"""Cross entropy of logits against class indices (the ``cross_entropy`` op): log_softmax and NLL fused, then the op's
reduction over rows. Each program computes its row's ``logsumexp(x) - x[target]`` with the softmax kernel's online
pass, so the (rows, classes) log-probabilities are never written. Rows whose target is ``ignore_index`` lose 0 and
count in no mean; a target outside the classes makes that row's loss NaN instead of reading out of bounds (torch
raises; a kernel cannot, cheaply). A row whose max is +inf loses what the op's naive composition gives: NaN where the
target's logit is +inf, +inf elsewhere."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import ROW_CONFIGS, row_block
from .runtime import implements, tuned
from .softmax import row_logsumexp

REDUCTIONS = ("mean", "sum", "none")


@triton.jit
def _cross_entropy_kernel(x_ptr, target_ptr, loss_ptr, n, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n
    target = tl.load(target_ptr + row)
    in_range = (target >= 0) & (target < n)
    m, s = row_logsumexp(x_row, n, BLOCK)
    x_t = tl.load(x_row + tl.where(in_range, target, 0)).to(tl.float32)
    loss = tl.where(m == float("inf"), tl.where(x_t == float("inf"), float("nan"), float("inf")), m + tl.log(s) - x_t)
    loss = tl.where(in_range, loss, float("nan"))
    tl.store(loss_ptr + row, tl.where(target == ignore_index, 0.0, loss))


def _class_indices(use) -> str | None:
    reduction = use.attrs[0] if use.attrs else "mean"
    if reduction not in REDUCTIONS:
        return f"triton.cross_entropy reduces by {REDUCTIONS}, not {reduction!r}"
    indices = len(use.shapes) < 2 or len(use.shapes[0]) == len(use.shapes[1]) + 1
    return None if indices else "triton.cross_entropy takes class indices (one fewer dim than the logits)"


@implements("cross_entropy", limits=_class_indices, dtypes=("int64", "int32"), configs=ROW_CONFIGS)
def cross_entropy(logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean",
                  ignore_index: int = -100, *, config: dict | None = None) -> torch.Tensor:
    """``F.cross_entropy(logits, target, reduction=..., ignore_index=...)``: classes on dim 1 (or
    dim 0 for a single unbatched row), as torch lays them out; losses summed in float32."""
    class_dim = 1 if logits.dim() > 1 else 0
    n = logits.shape[class_dim]
    rows, flat_target = logits.movedim(class_dim, -1).contiguous().reshape(-1, n), target.contiguous().reshape(-1)
    losses = torch.empty(rows.shape[0], dtype=torch.float32, device=logits.device)
    if rows.shape[0]:
        _cross_entropy_kernel[(rows.shape[0],)](rows, flat_target, losses, n, int(ignore_index),
                                                **tuned(config, ROW_CONFIGS, row_block, BLOCK=n))
    if reduction == "none":
        return losses.reshape(target.shape).to(logits.dtype)
    total = losses.sum()
    if reduction == "mean":
        total = total / (flat_target != ignore_index).sum()
    return total.to(logits.dtype)
