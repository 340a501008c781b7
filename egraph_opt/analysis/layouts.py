"""Memory layouts: where a value's dimensions lie in memory, as torch's kernels leave them.

A kernel's latency depends on its operands' layouts (attention over transposed heads is not the same kernel run as
over contiguous ones), so the profiling database keys rows by layout too. Strides follow from each op's ``layout``
fact: a "fresh" result is contiguous; a "view"'s strides are torch's own (``_run``); an op that "runs" (elementwise
ops, softmax, attention: their kernels choose an order from their operands') gives a contiguous result of contiguous
operands, and else is run once on zeros of its operands' strides (rare: an operand that is a view or made of one).
>>> layout_key((2, 3, 4), (12, 1, 3)), layout_key((2, 3), (0, 1)), layout_key((2, 3), (3, 1))
('0,2,1', 'b,0', None)
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Iterable

import torch

from ..lang.ops import OPS
from ..lang.term import Term, postorder

Strides = tuple[int, ...]


def contiguous(shape) -> Strides:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def layout_key(shape, strides: Strides | None) -> str | None:
    """None for a contiguous, empty (any strides are its layout) or unknown value; else each dimension's rank in
    memory, outermost (0) first, "b" where broadcast (stride 0), or "strided" for the dense order with gaps."""
    if strides is None or 0 in shape or all(s == c for d, s, c in zip(shape, strides, contiguous(shape)) if d > 1):
        return None
    dense = [d for d in range(len(shape)) if strides[d] or shape[d] <= 1]
    order = sorted(dense, key=lambda d: (-strides[d], d))
    ranks = ["b" if d not in dense else str(order.index(d)) for d in range(len(shape))]
    return "strided" if ranks == [str(d) for d in range(len(shape))] else ",".join(ranks)


def with_layout(x: torch.Tensor, key: str | None) -> torch.Tensor:
    """``x``'s values in the layout ``key`` names (to profile a kernel as it will run)."""
    if key is None:
        return x
    if key == "strided":
        return torch.stack([x, x], dim=-1).flatten(-2)[..., ::2]
    ranks = key.split(",")
    order = sorted((d for d in range(x.dim()) if ranks[d] != "b"), key=lambda d: int(ranks[d]))
    order += [d for d in range(x.dim()) if ranks[d] == "b"]
    x = x.permute(order).contiguous().permute(sorted(range(x.dim()), key=order.__getitem__))
    for d in (d for d in range(x.dim()) if ranks[d] == "b"):
        x = x.narrow(d, 0, 1).expand(x.shape)
    return x


def result_strides(op: str, attrs: tuple, operands: list, strides: list, shape) -> Strides:
    """Strides of an ``op`` result of ``shape``, for a term or an e-class alike: its operands are
    (shape, dtype) or None (a constant), with their ``strides``; a leaf's are contiguous."""
    found = [(tuple(m[0]), tuple(s), m[1]) if m else None for m, s in zip(operands, strides)]
    kind = OPS[op].layout if operands else None
    return (kind == "view" or kind == "runs" and any(f and layout_key(f[0], f[1]) for f in found)) and \
        _run(op, attrs, tuple(found)) or contiguous(shape)


@functools.lru_cache(maxsize=4096)
def _run(op: str, attrs: tuple, operands: tuple) -> Strides | None:
    """The strides torch's own kernel gives, run on tensors of the operands' strides: a view reads
    no memory (left uninitialized); another op runs on zeros (finite values: the kernel path a
    program takes, not an overflow fallback's). None where it cannot run so: taken as contiguous."""
    args = [torch.empty_strided(shape, strides, dtype=dtype) if f else 1.0
            for f in operands for shape, strides, dtype in [f or (None,) * 3]]
    if OPS[op].layout != "view":
        args = [a.zero_() if isinstance(a, torch.Tensor) else a for a in args]
    with warnings.catch_warnings(), torch.no_grad(), contextlib.suppress(RuntimeError, TypeError, ValueError):
        warnings.simplefilter("ignore")
        return tuple(OPS[op].impl(*args, *attrs).stride())
    return None


def term_strides(roots: Iterable[Term], meta: dict) -> dict[int, Strides]:
    """Strides of every term (by id) of a program whose shapes are ``meta``."""
    out: dict[int, Strides] = {}
    for t in postorder(list(roots)):
        out[id(t)] = result_strides(t.op, t.attrs, [None if a.op == "const" else meta[id(a)] for a in t.args],
                                    [out[id(a)] for a in t.args], meta[id(t)][0])
    return out


def operand_layouts(shapes: Iterable, strides: Iterable[Strides | None]) -> tuple:
    """A node's operands' layout keys; () when all are contiguous, the key of rows recorded before layouts."""
    keys = tuple(layout_key(s, st) for s, st in zip(shapes, strides))
    return keys if any(keys) else ()


def layout_attr(layouts: tuple) -> dict:
    """The attribute a database row carries for operand layouts (none when all are contiguous)."""
    return {"layout": list(layouts)} if layouts else {}

