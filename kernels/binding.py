"""Binding: each node of an extracted program to the cheapest kernel that accepts it.

Candidates are the registry's kernels for the node's op that accept its shapes, dtypes and device
(Triton only where it runs natively: CUDA tensors and an importable triton). A candidate's cost is
its latency estimate plus the conversions its operands need from the backends that produced them.
No candidate (never the case for the torch backend, which covers every op) is an error.
"""
from __future__ import annotations

import math
from typing import Callable

from . import triton as triton_kernels
from .registry import Kernel, Use, kernels_for

#: estimate(kernel, use) -> seconds; the default ranks backends for a device and nothing more
Estimate = Callable[[Kernel, Use], float]
_PREFERENCE = {"triton": 0.8, "torch": 1.0, "numpy": 1.0}


def default_estimate(kernel: Kernel, use: Use) -> float:
    elements = sum(math.prod(s) for s in use.shapes) or 1
    return _PREFERENCE[kernel.backend] * (5e-6 + 4 * elements / 2e10)


def conversion_seconds(use: Use, source: str, target: str) -> float:
    """Moving operands between backends: an overhead per operand plus a pass over its memory."""
    if source == target:
        return 0.0
    return sum(2e-6 + 4 * math.prod(s) / 1e10 for s in use.shapes)


def usable(kernel: Kernel) -> bool:
    return kernel.backend != "triton" or triton_kernels.available()


def bind(use: Use, operand_backends: tuple[str, ...] = (),
         estimate: Estimate = default_estimate) -> Kernel:
    """The cheapest kernel that accepts ``use``, conversions from ``operand_backends`` included."""
    best, best_cost, reasons = None, math.inf, []
    for kernel in kernels_for(use.op):
        reason = kernel.refuses(use) or (None if usable(kernel) else f"{kernel.name}: no native triton")
        if reason:
            reasons.append(reason)
            continue
        cost = estimate(kernel, use) + sum(
            conversion_seconds(use, b, kernel.backend) for b in set(operand_backends))
        if cost < best_cost:
            best, best_cost = kernel, cost
    if best is None:
        raise LookupError(f"no kernel accepts {use.op} on {use.device} {use.dtypes}: {reasons}")
    return best
