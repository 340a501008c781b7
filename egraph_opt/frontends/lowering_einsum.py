"""Lowering of two-operand einsums that are one batched matmul ('bhid,bhjd->bhij' is q @ k^T,
'bhij,bhjd->bhid' is w @ v): each operand permuted to (batch, free, contracted) and
(batch, contracted, free), a matmul, and the result permuted to the output's order."""
from __future__ import annotations

import torch

from . import forms
from .lowering import Unsupported, lowers
from ..lang.term import Term


def matmul_axes(equation: str) -> tuple[str, str, str, str, str]:
    """(a, b, out, batch, contracted) letters of a matmul einsum; refuses any other.

    >>> matmul_axes("bhid,bhjd->bhij")
    ('bhid', 'bhjd', 'bhij', 'bh', 'd')
    """
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq or eq.count(",") != 1:
        raise Unsupported(f"einsum {equation!r}: not two operands with an explicit output")
    a, rest = eq.split(",")
    b, out = rest.split("->")
    if any(len(set(s)) != len(s) for s in (a, b, out)) or not set(out) <= set(a) | set(b):
        raise Unsupported(f"einsum {equation!r}: a repeated or unknown letter")
    batch = "".join(x for x in out if x in a and x in b)
    contracted = "".join(x for x in a if x in b and x not in out)
    free_a = [x for x in a if x not in b]
    free_b = [x for x in b if x not in a]
    if len(contracted) != 1 or len(free_a) != 1 or len(free_b) != 1 \
            or len(out) != len(batch) + 2 or not {*free_a, *free_b} <= set(out):
        raise Unsupported(f"einsum {equation!r}: not one contracted and one free axis per operand")
    return a, b, out, batch, contracted


@lowers(torch.einsum, torch.ops.aten.einsum.default)
def _einsum(c, equation, *operands, path=None):
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if len(operands) != 2:
        raise Unsupported("einsum of other than two operands")
    x, y = (c.tensor(t) for t in operands)
    a, b, out, batch, k = matmul_axes(equation)
    if (c.rank(x), c.rank(y)) != (len(a), len(b)):
        raise Unsupported("einsum letters and ranks differ")
    sizes_x, sizes_y = c.info(x).shape, c.info(y).shape
    if any(sizes_x[a.index(d)] != sizes_y[b.index(d)] for d in batch + k):
        raise Unsupported("einsum broadcasting a batch or contracted axis")
    (i,), (j,) = (set(a) - set(b)), (set(b) - set(a))
    left = forms.permute(x, [a.index(d) for d in batch + i + k], len(a))
    right = forms.permute(y, [b.index(d) for d in batch + k + j], len(b))
    product = Term("matmul", (left, right))
    return forms.permute(product, [(batch + i + j).index(d) for d in out], len(out))
