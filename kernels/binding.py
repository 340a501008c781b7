"""Binding: each node of an extracted program to the cheapest kernel that accepts it.

Candidates are the registry's kernels for the node's op that accept its shapes, dtypes and device
(Triton only where it runs: CUDA tensors and an importable triton, or CPU tensors under the test
switch ``EGRAPH_OPT_TRITON_ON_CPU``). A candidate's cost is its latency in the profiling database,
measured or interpolated from rows of its own backend, plus the moves its operands need from the
backends that produced them (move kernels, measured too). The torch kernel covers every op and is
always a candidate (a static estimate where nothing is measured); another backend is chosen only
by its measurements, never by a preference (but under the test switch, where a Triton kernel that
accepts a node runs it), and so is a region's generated kernel over its ops' kernels. Extraction
prices a node the same way (``Pricing``), so the cost sees what will run. No candidate is an error.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from . import triton as triton_kernels
from .registry import MOVES, Kernel, Use, copies, kernels_for
from egraph_opt.analysis.facts import NodeFacts
from egraph_opt.profiling.latency import UNIT_S, default_budget
from egraph_opt.profiling.profiler import MOVE, time_side_by_side

#: estimate(kernel, use) -> seconds (inf: not a candidate)
Estimator = Callable[[Kernel, Use], float]


def default_estimate(kernel: Kernel, use: Use) -> float:
    """Nothing measured: the op's torch kernel, by the memory it touches, and a move (an overhead
    and a pass over the value); no other kernel."""
    elements = sum(math.prod(s) for s in use.shapes) or 1
    if kernel.op == MOVE:
        return 2e-6 + 4 * elements / 1e10
    if kernel.db_backend != "torch" and not _preferred(kernel, use):
        return math.inf
    return 5e-6 + 4 * elements / 2e10


def measured_estimate(latency) -> Estimator:
    """Seconds of a kernel from ``latency`` (a MeasuredLatency): the rows of the kernel's backend,
    measured or interpolated; the torch kernel and moves fall back to their defaults where nothing
    is known, other backends are then no candidates; ``.config(kernel, use)``: its tuned configuration."""
    def node(use: Use) -> NodeFacts:
        return NodeFacts(op=use.op, attrs=use.attrs, shapes=use.shapes, layouts=use.layouts,
                         dtype=use.dtypes[0] if use.dtypes else "float32")

    def estimate(kernel: Kernel, use: Use) -> float:
        found = _measured(latency, kernel, node(use))
        return found[0] * UNIT_S if found else default_estimate(kernel, use)
    estimate.config = lambda kernel, use: next((c for c in getattr(kernel.impl, "configs", ()) if latency
                                                and c == latency(node(use), kernel, tuned=True)), None)
    return estimate


class Pricing:
    """Called with a node's NodeFacts: (units, source) of the kernel binding will choose for it on
    ``device``, its operands in torch memory (the cheapest usable candidate, the moves into its
    backend included), for the cost model; ``paths(node)`` every kernel binding weighs for it,
    with its seconds or why not, for the explorer."""

    def __init__(self, latency, device: str):
        self.latency, self.device, self.estimate = latency, device, measured_estimate(latency)

    def _use(self, n: NodeFacts) -> Use:
        return Use(op=n.op, attrs=n.attrs, shapes=n.shapes, dtypes=(n.dtype,) * len(n.shapes),
                   device=self.device, layouts=n.layouts)

    def __call__(self, n: NodeFacts):
        use = self._use(n)
        ready = [k for k in kernels_for(n.op) if usable(k, self.device) and not k.refuses(use)]
        return min([(own[0] + round(conversion_seconds(use, "torch", k.backend, self.estimate) / UNIT_S),
                     own[1]) for k in ready if (own := _measured(self.latency, k, n, len(ready) > 1))],
                   default=None)

    def paths(self, n: NodeFacts) -> list[Path]:
        return paths(self._use(n), ("torch",), self.estimate)


def _measured(latency, kernel: Kernel, n: NodeFacts, choice: bool = True):
    """(units, source) of ``kernel`` from the database, or None: not known there (and, but for
    the op's own torch kernel, only the kernel's own measured or interpolated rows count)."""
    found = latency(n, kernel, choice) if latency is not None else None
    if found and kernel.db_backend != "torch" and found[1] not in ("measured", "interpolated"):
        return None
    return found


def conversion_seconds(use: Use, source: str, target: str,
                       estimate: Estimator = default_estimate) -> float:
    """Moving ``use``'s operands from ``source``'s memory into ``target``'s: the move kernel's
    seconds (``estimate``: measured where the database has them) for each operand."""
    if not copies(source, target):
        return 0.0
    move = MOVES[source, target]
    layouts = use.layouts or (None,) * len(use.shapes)
    return sum(estimate(move, Use(op=MOVE, attrs=(), shapes=(shape,), dtypes=(dtype,), device=use.device,
                                  layouts=(key,) if key else ()))
               for shape, dtype, key in zip(use.shapes, use.dtypes, layouts))


#: (structure, dtypes, device, size's power of two) -> whether the region's kernel measured faster
_region_faster: dict[tuple, bool] = {}


def region_chosen(kernel, operands: list[tuple], device: str) -> bool:
    """Whether a region's generated kernel replaces its ops' separate kernels: where it measures
    faster beside them, once per structure, dtypes and size bucket within the profiling budget (at
    most 0.1 s; none: never); never by preference, but under the test switch (``_preferred``)."""
    if device == "cpu":
        return triton_kernels.on_cpu()
    key = (kernel.__name__, *(dtype for _, dtype in operands), device,  # operands: (shape, dtype)
           max(math.prod(shape) for shape, _ in operands).bit_length())
    if key not in _region_faster:
        inputs = [torch.full(shape, 0.75, dtype=dtype, device=device) for shape, dtype in operands]
        seconds = time_side_by_side([kernel, kernel.separate], inputs, device, min(default_budget(), 0.1))
        _region_faster[key] = seconds is not None and seconds[0] < seconds[1]
    return _region_faster[key]


def usable(kernel: Kernel, device: str) -> bool:
    return kernel.backend != "triton" or triton_kernels.available(device)


def _preferred(kernel: Kernel, use: Use) -> bool:
    """Under the test switch a Triton kernel runs wherever it accepts a node on CPU: its
    interpreted timings mean nothing, and the point is to run the Triton path."""
    return kernel.backend == "triton" and use.device == "cpu" and triton_kernels.on_cpu()


class Path(NamedTuple):
    """One way to run a node: a kernel and its seconds, conversions from its operands' backends
    included (inf, with the reason, where it cannot run the node or is not measured)."""
    seconds: float
    kernel: Kernel
    refused: str | None = None


def paths(use: Use, operand_backends: tuple[str, ...] = (),
          estimate: Estimator = default_estimate) -> list[Path]:
    """Every kernel of the registry for ``use``'s op, the cheapest first."""
    found = []
    for kernel in kernels_for(use.op):
        reason = kernel.refuses(use) or (None if usable(kernel, use.device) else
                                         f"{kernel.name}: no triton on {use.device}")
        seconds = math.inf if reason else estimate(kernel, use) + sum(
            conversion_seconds(use, b, kernel.backend, estimate) for b in set(operand_backends))
        found.append(Path(seconds, kernel, reason or (None if seconds < math.inf else
                                                      f"{kernel.name}: not measured here")))
    return sorted(found, key=lambda p: (p.seconds == math.inf, not _preferred(p.kernel, use), p.seconds))


def bind(use: Use, operand_backends: tuple[str, ...] = (),
         estimate: Estimator = default_estimate) -> Kernel:
    """The cheapest kernel that accepts ``use``, conversions from ``operand_backends`` included
    (the registry's order breaks ties: torch first)."""
    found = paths(use, operand_backends, estimate)
    if not found or found[0].seconds == math.inf:
        raise LookupError(f"no kernel accepts {use.op} on {use.device} {use.dtypes}: "
                          f"{[p.refused for p in found]}")
    return found[0].kernel
