"""Block and tile sizes the kernels launch with (a row kernel reads its rows in blocks, a matmul
in tiles), whether ``tl.dot``'s operands are widened first, and how it multiplies float32."""
from __future__ import annotations

import os

import torch
import triton

MAX_ROW_BLOCK = 1024  # rows longer than this are looped over in blocks of this many elements
#: a row kernel's configurations, the default first: the block a long row is read in, and warps
ROW_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((MAX_ROW_BLOCK, 4), (256, 2), (4096, 8))]


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def row_block(n: int, cap: int = MAX_ROW_BLOCK) -> int:
    """The block a row of ``n`` elements is read in: one block when it fits, ``cap`` otherwise."""
    return min(next_pow2(n), cap)


def dot_tile(n: int, cap: int | None = None) -> int:
    """A tile dim for ``n``: a power of two, at least 16 (``tl.dot``'s minimum), at most ``cap``."""
    tile = max(next_pow2(n), 16)
    return tile if cap is None else min(tile, cap)


def widen_dot(dtype: torch.dtype) -> bool:
    """Whether ``tl.dot``'s operands are widened to float32 first: Triton's interpreter holds
    bfloat16 as its raw bits (uint16) and multiplies those. Exact: a product of two bfloat16 is a
    float32, as a GPU's bfloat16 MMA with float32 accumulation has it."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: TF32 for float32 only where torch's own matmuls may use it."""
    try:
        tf32 = torch.backends.cuda.matmul.allow_tf32
    except RuntimeError:  # set through the newer API, which then refuses a read of the older flag
        tf32 = torch.backends.cuda.matmul.fp32_precision == "tf32"
    return "tf32" if tf32 and dtype == torch.float32 else "ieee"
