"""Binding: each node of an extracted program to the cheapest kernel that accepts it.

A candidate's cost is its latency in the profiling database (rows of its own backend) plus the moves its operands need
from the backends that produced them. The torch kernel covers every op (a static estimate where nothing is measured);
another backend, or a region's generated kernel, is chosen only by its measurements, never by a preference (but under
the test switch, where Triton runs wherever it accepts a node). Extraction prices a node the same way (``Pricing``)."""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Callable, NamedTuple

import torch

from . import triton as triton_kernels
from .registry import MOVES, Kernel, Use, copies, kernels_for
from egraph_opt.analysis.facts import NodeFacts
from egraph_opt.lang.term import dtype_name
from egraph_opt.profiling.latency import UNIT_S, default_budget
from egraph_opt.profiling.profile_db import UNUSABLE, Record
from egraph_opt.profiling.profiler import MOVE, fastest, time_side_by_side

Estimator = Callable[[Kernel, Use], float]  #: estimate(kernel, use) -> seconds (inf: not a candidate)


def default_estimate(kernel: Kernel, use: Use) -> float:
    """Nothing measured: torch's kernel by its memory traffic, a move by an overhead and a pass; no other."""
    elements = sum(math.prod(s) for s in use.shapes) or 1
    return 2e-6 + 4 * elements / 1e10 if kernel.op == MOVE else \
        math.inf if kernel.db_backend != "torch" and not _preferred(kernel, use) else 5e-6 + 4 * elements / 2e10


def measured_estimate(latency) -> Estimator:
    """Seconds of a kernel from ``latency`` (a MeasuredLatency), by its backend's rows, else torch's and moves' defaults
    (other backends none). ``.config(kernel, use)``: its tuned configuration; ``.latency``: ``latency``."""
    def node(use: Use) -> NodeFacts:
        return NodeFacts(op=use.op, attrs=use.attrs, shapes=use.shapes, layouts=use.layouts,
                         dtype=use.dtypes[0] if use.dtypes else "float32")
    def estimate(kernel: Kernel, use: Use) -> float:
        found = _measured(latency, kernel, node(use))
        return found[0] * UNIT_S if found else default_estimate(kernel, use)
    estimate.config = lambda kernel, use: next((c for c in getattr(kernel.impl, "configs", ()) if latency
                                                and c == latency(node(use), kernel, tuned=True)), None)
    estimate.latency = latency
    return estimate


class Pricing:
    """(units, source) of the kernel binding chooses for a node's NodeFacts on ``device``, operands in torch memory
    (moves into its backend included), for the cost model; ``paths(node)``: every kernel weighed, for the explorer."""

    def __init__(self, latency, device: str):
        self.latency, self.device, self.estimate = latency, device, measured_estimate(latency)

    def _use(self, n: NodeFacts) -> Use:
        return Use(op=n.op, attrs=n.attrs, shapes=n.shapes, dtypes=(n.dtype,) * len(n.shapes),
                   device=self.device, layouts=n.layouts)

    def __call__(self, n: NodeFacts):
        use = self._use(n)
        found = ready(use)
        return min([(own[0] + round(conversion_seconds(use, "torch", k.backend, self.estimate) / UNIT_S),
                     own[1]) for k in found if (own := _measured(self.latency, k, n, len(found) > 1))], default=None)

    def paths(self, n: NodeFacts) -> list[Path]:
        return paths(self._use(n), ("torch",), self.estimate)


def _measured(latency, kernel: Kernel, n: NodeFacts, choice: bool = True):
    """(units, source) of ``kernel`` from the database, or None: not known there (and, but for
    the op's own torch kernel, only the kernel's own measured or interpolated rows count)."""
    found = latency(n, kernel, choice) if latency is not None else None
    return None if found and kernel.db_backend != "torch" and found[1] not in ("measured", "interpolated") else found


def conversion_seconds(use: Use, source: str, target: str, estimate: Estimator = default_estimate) -> float:
    """Seconds moving ``use``'s operands from ``source``'s memory to ``target``'s, by the move kernel."""
    if not copies(source, target):
        return 0.0
    move, layouts = MOVES[source, target], use.layouts or (None,) * len(use.shapes)
    return sum(estimate(move, Use(op=MOVE, attrs=(), shapes=(shape,), dtypes=(dtype,), device=use.device,
                                  layouts=(key,) if key else ()))
               for shape, dtype, key in zip(use.shapes, use.dtypes, layouts))


#: (structure, dtypes, device, size's power of two) -> whether the region's kernel measured faster
_region_faster: dict[tuple, bool] = {}


def region_chosen(kernel, operands: list[tuple], device: str, latency=None) -> tuple[bool, dict | None]:
    """Whether a region's generated kernel replaces its ops' separate kernels, and the configuration it runs in. Chosen
    where it measures faster beside them, once per structure, dtypes and size bucket, within the profiling budget (at
    most 0.1 s, and as much to tune it), never by preference but under the test switch (``_preferred``). Its
    configuration: the fastest at the nearest shape in ``latency``'s database (a row each time it is timed)."""
    shapes, dtype = [shape for shape, _ in operands], dtype_name(operands[0][1])  # operands: (shape, dtype)
    key = (kernel.__name__, *(d for _, d in operands), device, max(map(math.prod, shapes)).bit_length())
    group = (kernel.__name__, "triton", latency.where, dtype) if latency is not None and latency.db else None
    config = seconds = found = None
    if device != "cpu" and key not in _region_faster:
        inputs = [torch.full(shape, 0.75, dtype=d, device=device) for shape, d in operands]
        config = fastest(kernel, inputs, torch.device(device), min(default_budget(), 0.1))
        seconds = time_side_by_side([functools.partial(kernel, config=config), kernel.separate], inputs, device,
                                    min(default_budget(), 0.1))
        _region_faster[key] = seconds is not None and seconds[0] < seconds[1]
    with contextlib.suppress(*UNUSABLE):  # the database is a cache
        if seconds and group:
            latency.db.add(Record(kernel=group[0], backend="triton", device=group[2], dtype=dtype, shapes=shapes,
                                  attrs={}, runs=1, median_s=seconds[0], spread_s=0.0, config=config))
        found = group and latency.model.predict(*group, shapes, {})
    return triton_kernels.on_cpu() if device == "cpu" else _region_faster[key], found and found.config


def usable(kernel: Kernel, device: str) -> bool:
    return kernel.backend != "triton" or triton_kernels.available(device)


def ready(use: Use) -> list[Kernel]:
    """The registry's kernels that run ``use`` here: usable on its device and not refusing it."""
    return [k for k in kernels_for(use.op) if usable(k, use.device) and not k.refuses(use)]


def _preferred(kernel: Kernel, use: Use) -> bool:
    """Under the test switch Triton runs wherever it accepts a CPU node: interpreted timings mean nothing."""
    return kernel.backend == "triton" and use.device == "cpu" and triton_kernels.on_cpu()


class Path(NamedTuple):
    """A way to run a node: a kernel, its seconds with moves (inf, with why, where refused or unmeasured)."""
    seconds: float
    kernel: Kernel
    refused: str | None = None


def paths(use: Use, operand_backends: tuple[str, ...] = (), estimate: Estimator = default_estimate) -> list[Path]:
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


def bind(use: Use, operand_backends: tuple[str, ...] = (), estimate: Estimator = default_estimate) -> Kernel:
    """The cheapest kernel accepting ``use``, conversions from ``operand_backends`` included; ties: torch."""
    if not (found := paths(use, operand_backends, estimate)) or found[0].seconds == math.inf:
        raise LookupError(f"no kernel accepts {use.op} on {use.device} {use.dtypes}: {[p.refused for p in found]}")
    return found[0].kernel
