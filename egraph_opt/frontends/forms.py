"""The normal forms both frontends write (torch lowering, ONNX import): rules meet one spelling."""
from __future__ import annotations

from ..lang.ops import shape_attr
from ..lang.term import Term


class Unsupported(Exception):
    """This call or node, with these operands, has no exact Term: it stays opaque."""


def axis(dim: int, rank: int) -> int:
    """Canonical axis: negative, counted from the end, so patterns are rank-independent."""
    if not -rank <= dim < max(rank, 1):
        raise Unsupported(f"axis {dim} out of range for rank {rank}")
    return dim - rank if dim >= 0 else dim


def reduce(op: str, x: Term, axes, rank: int, keepdim: bool) -> Term:
    """``op`` over each of ``axes`` (either sign), one axis at a time, the last first."""
    out, current = x, rank
    for p in sorted({int(a) % rank for a in axes} if rank else (), reverse=True):
        out = Term(op, (out,), (p - current, keepdim))
        current -= 0 if keepdim else 1
    return out


def permute(x: Term, perm, rank: int) -> Term:
    """``x`` itself, a swap of its last two axes (``transpose``) or a ``permute``."""
    perm = tuple(int(d) % rank for d in perm)
    if perm == tuple(range(rank)):
        return x
    if rank >= 2 and perm == tuple(range(rank - 2)) + (rank - 1, rank - 2):
        return Term("transpose", (x,), (-2, -1))
    return Term("permute", (x,), (shape_attr(perm),))
