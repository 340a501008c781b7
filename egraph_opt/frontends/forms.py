"""The normal forms both frontends write (torch lowering, ONNX import): rules meet one spelling."""
from __future__ import annotations

import functools
import math

import numpy as np

from ..lang.ops import shape_attr
from ..lang.term import Term, pretty


class Unsupported(Exception):
    """This call or node, with these operands, has no exact Term: it stays opaque."""


def axis(dim: int, rank: int) -> int:
    """Canonical axis: negative, counted from the end, so patterns are rank-independent."""
    if not -rank <= dim < max(rank, 1):
        raise Unsupported(f"axis {dim} out of range for rank {rank}")
    return dim - rank if dim >= 0 else dim


def concat(terms, axis: int) -> Term:
    """Operands joined along ``axis`` (canonical) as binary concats, left to right: torch's cat and ONNX's Concat."""
    return functools.reduce(lambda a, b: Term("concat", (a, b), (axis,)), terms)


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
    return Term("transpose", (x,), (-2, -1)) if rank >= 2 and perm == tuple(range(rank - 2)) + (rank - 1, rank - 2) \
        else Term("permute", (x,), (shape_attr(perm),))


#: dtypes whose kernels take a Python scalar operand in float32 (half precision's opmath included)
_SCALAR_IN_FLOAT32 = ("float32", "float16", "bfloat16")


def constant(value: float, dtype: str) -> Term:
    """A scalar operand of a ``dtype`` tensor as the kernel computes with it: a Python int, a
    float64 or float32 number, or a 0-d tensor of any of them all give one const. torch rounds a
    scalar beside a float32 or half tensor to float32 (kept where that overflows: no new inf).
    >>> constant(0.1, "float32").attrs == constant(np.float32(0.1), "float32").attrs
    True
    """
    value = float(value)
    if dtype in _SCALAR_IN_FLOAT32:
        rounded = float(np.float32(value))
        value = rounded if math.isfinite(rounded) or not math.isfinite(value) else value
    return Term.const(value)


def binary(op: str, a: Term, b: Term) -> Term:
    """``a op b`` with constants in one place and one sign (each an exact identity in IEEE arithmetic, signed zeros and
    NaN too): a constant on the right of ``+`` and ``*``; a constant added or subtracted is never negative (``x + (-2)``
    is ``x - 2``, ``x - (-0.0)`` is ``x + 0.0``); division by a power of two is multiplication by its exact reciprocal
    (``x / 4`` is ``x * 0.25``); by any other it stays (``x * (1/c)`` rounds twice: another program).
    >>> x = Term.input("x", (3,))
    >>> [pretty(binary(*e)) for e in (("sub", x, Term.const(-2.0)), ("div", x, Term.const(4.0)))]
    ['x + 2.0', 'x * 0.25']
    """
    if op in ("add", "mul") and a.op == "const" and b.op != "const":
        a, b = b, a
    if b.op == "const" and a.op != "const":
        c = b.attrs[0]
        if op in ("add", "sub") and math.copysign(1.0, c) < 0 and not math.isnan(c):
            return Term("sub" if op == "add" else "add", (a, Term.const(-c)))
        if op == "div" and c and math.isfinite(c) and abs(math.frexp(c)[0]) == 0.5 \
                and F32_TINY <= abs(1.0 / c) <= F32_MAX:
            return Term("mul", (a, Term.const(1.0 / c)))
    return Term(op, (a, b))


F32_MAX, F32_TINY = float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)
