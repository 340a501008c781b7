"""Lowering of two-operand einsums that are one batched matmul ('bhid,bhjd->bhij' is q @ k^T, 'bhij,bhjd->bhid' is
w @ v): operands permuted to (batch, free, contracted) and (batch, contracted, free), a matmul, the result permuted."""
from __future__ import annotations

import re

import torch

from . import forms
from .lowering import Unsupported, lowers
from ..lang.term import Term


def matmul_axes(equation: str) -> tuple[str, str, str, str, str]:
    """(a, b, out, batch, contracted) letters of a matmul einsum; refuses any other.
    >>> matmul_axes("bhid,bhjd->bhij")
    ('bhid', 'bhjd', 'bhij', 'bh', 'd')
    """
    parts = re.fullmatch(r"([a-zA-Z]+),([a-zA-Z]+)->([a-zA-Z]+)", equation.replace(" ", ""))
    if parts is None or any(len(set(s)) != len(s) for s in parts.groups()):
        raise Unsupported(f"einsum {equation!r}: not two operands with an explicit output, each letter once")
    a, b, out = parts.groups()
    batch, contracted = "".join(x for x in out if x in a and x in b), "".join(x for x in a if x in b and x not in out)
    free_a, free_b = ("".join(x for x in s if x not in t) for s, t in ((a, b), (b, a)))
    if not len(contracted) == len(free_a) == len(free_b) == 1 or sorted(out) != sorted(batch + free_a + free_b):
        raise Unsupported(f"einsum {equation!r}: not one contracted and one free axis per operand")
    return a, b, out, batch, contracted


@lowers(torch.einsum, torch.ops.aten.einsum.default)
def _einsum(c, equation, *operands, path=None):
    """Any other einsum lowers through torch's decomposition (``lowering_core``)."""
    x, y = operands[0] if len(operands) == 1 else operands  # (a, b) or [a, b]; any other number: ValueError
    a, b, out, batch, k = matmul_axes(equation)
    if (c.rank(x), c.rank(y)) != (len(a), len(b)) \
            or any(c.info(x).shape[a.index(d)] != c.info(y).shape[b.index(d)] for d in batch + k):
        raise Unsupported("einsum letters and ranks differ, or it broadcasts a batch or contracted axis")
    (i,), (j,) = (set(a) - set(b)), (set(b) - set(a))
    left = forms.permute(x, [a.index(d) for d in batch + i + k], len(a))
    right = forms.permute(y, [b.index(d) for d in batch + k + j], len(b))
    return forms.permute(Term("matmul", (left, right)), [(batch + i + j).index(d) for d in out], len(out))
