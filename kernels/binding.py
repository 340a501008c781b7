"""Binding: each node of an extracted program to the cheapest kernel that accepts it.

Candidates are the registry's kernels for the node's op that accept its shapes, dtypes and device
(Triton only where it runs natively: CUDA tensors and an importable triton). A candidate's cost is
its latency in the profiling database, measured or interpolated from rows of its own backend, plus
the conversions its operands need from the backends that produced them. The torch kernel covers
every op and is always a candidate (a static estimate where nothing is measured); another backend
is chosen only by its measurements, never by a preference. Extraction prices a node the same way
(``pricing``), so the cost sees what will run. No candidate is an error.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from . import triton as triton_kernels
from .registry import Kernel, Use, kernels_for
from egraph_opt.profiling.latency import UNIT_S

#: estimate(kernel, use) -> seconds (inf: not a candidate)
Estimate = Callable[[Kernel, Use], float]


def default_estimate(kernel: Kernel, use: Use) -> float:
    """Nothing measured: the op's torch kernel, by the memory it touches; no other kernel."""
    if kernel.rows != "torch":
        return math.inf
    elements = sum(math.prod(s) for s in use.shapes) or 1
    return 5e-6 + 4 * elements / 2e10


def measured_estimate(latency) -> Estimate:
    """Seconds of a kernel from ``latency`` (a MeasuredLatency): the rows of the kernel's backend,
    measured or interpolated; the torch kernel falls back to its default where the op has no
    latency model, other backends are then no candidates."""
    def estimate(kernel: Kernel, use: Use) -> float:
        found = _measured(latency, kernel, use.op, use.attrs, use.shapes,
                          use.dtypes[0] if use.dtypes else "float32")
        return found[0] * UNIT_S if found else default_estimate(kernel, use)
    return estimate


def pricing(latency, device: str) -> Callable:
    """``latency_of(op, attrs, shapes, dtype) -> (units, source)`` of the kernel binding will
    choose for such a node on ``device`` (the cheapest usable candidate), for the cost model."""
    def latency_of(op: str, attrs: tuple, shapes: tuple, dtype: str):
        use = Use(op, attrs, shapes, (dtype,) * len(shapes), device)
        found = [_measured(latency, k, op, attrs, shapes, dtype) for k in kernels_for(op)
                 if usable(k) and not k.refuses(use)]
        found = [f for f in found if f]
        return min(found) if found else None
    return latency_of


def _measured(latency, kernel: Kernel, op: str, attrs: tuple, shapes: tuple, dtype: str):
    """(units, source) of ``kernel`` from the database, or None: not known there (and, but for
    the op's own torch kernel, only the kernel's own measured or interpolated rows count)."""
    found = latency(op, attrs, shapes, dtype, kernel) if latency is not None else None
    if found and kernel.rows != "torch" and found[1] not in ("measured", "interpolated"):
        return None
    return found


def conversion_seconds(use: Use, source: str, target: str) -> float:
    """Moving operands between backends: an overhead per operand plus a pass over its memory."""
    if source == target:
        return 0.0
    return sum(2e-6 + 4 * math.prod(s) / 1e10 for s in use.shapes)


def usable(kernel: Kernel) -> bool:
    return kernel.backend != "triton" or triton_kernels.available()


class Path(NamedTuple):
    """One way to run a node: a kernel and its seconds, conversions from its operands' backends
    included (inf, with the reason, where it cannot run the node or is not measured)."""
    seconds: float
    kernel: Kernel
    refused: str | None = None


def paths(use: Use, operand_backends: tuple[str, ...] = (),
          estimate: Estimate = default_estimate) -> list[Path]:
    """Every kernel of the registry for ``use``'s op, the cheapest first."""
    found = []
    for kernel in kernels_for(use.op):
        reason = kernel.refuses(use) or (None if usable(kernel) else f"{kernel.name}: no native triton")
        seconds = math.inf if reason else estimate(kernel, use) + sum(
            conversion_seconds(use, b, kernel.backend) for b in set(operand_backends))
        found.append(Path(seconds, kernel, reason or (None if seconds < math.inf else
                                                      f"{kernel.name}: not measured here")))
    return sorted(found, key=lambda p: p.seconds)


def bind(use: Use, operand_backends: tuple[str, ...] = (),
         estimate: Estimate = default_estimate) -> Kernel:
    """The cheapest kernel that accepts ``use``, conversions from ``operand_backends`` included
    (the registry's order breaks ties: torch first)."""
    found = paths(use, operand_backends, estimate)
    if not found or found[0].seconds == math.inf:
        raise LookupError(f"no kernel accepts {use.op} on {use.device} {use.dtypes}: "
                          f"{[p.refused for p in found]}")
    return found[0].kernel
