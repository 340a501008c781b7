"""``egraph_opt.shard(fn, *example_args, mesh=N)``: a plan that splits a program over N devices.

A large batch through a small layer, over a fast link, priced by roofline defaults (an empty
database): data parallel, the rows split and gathered once.
>>> import tempfile, torch
>>> from egraph_opt.sharding.cost import Link
>>> fast = {c: Link(1e-6, 1e-12) for c in ("all_gather", "all_reduce", "reduce_scatter")}
>>> plan = shard(torch.nn.Linear(64, 64), torch.randn(4096, 64), mesh=2, links=fast,
...              profile_db=tempfile.mkdtemp() + "/p.sqlite", profile_budget=0)
>>> plan.mesh, sorted(plan.collectives())
(2, ['all_gather'])
"""
from __future__ import annotations

from typing import Any

import torch
from torch.fx.node import map_aggregate

from ..frontends.capture import capture
from ..lang.ops import OPS, parse_shape
from ..lang.term import Term, postorder, pretty, shapes
from ..egraph.session import Limits
from ..profiling.latency import UNIT_S, MeasuredLatency, default_budget
from ..sharding import run as runner
from ..sharding.cost import measured_links
from ..sharding.plan import Candidate, Search, ShardingError, search
from .pictures import Table, clip

__all__ = ["shard", "ShardedPlan", "ShardingError"]


def shard(fn, *example_args, mesh: int = 2, memory: int | None = None, links: dict | None = None,
          profile_db=None, profile_budget: float | None = None, limits: Limits = Limits()) -> ShardedPlan:
    """Capture ``fn`` at ``example_args`` and choose how to split it over ``mesh`` devices.

    ``memory``: bytes each device holds at most (a constraint); ``links``: the alpha-beta model per collective (default:
    what ``egraph-opt profile --collectives`` measured); ``profile_db``: the latency database (``False``: static
    estimates); ``profile_budget``: seconds to time unmeasured ops at one device's shapes (default 2; 0: none)."""
    if not isinstance(mesh, int) or mesh < 1:
        raise ShardingError(f"mesh is a number of devices (1 or more), not {mesh!r}")
    program, _ = capture(fn, example_args)
    budget = default_budget() if profile_budget is None else profile_budget
    latency = None if profile_db is False else MeasuredLatency.from_database(profile_db, budget_s=budget)
    return ShardedPlan(search(program, mesh, limits=limits, latency=latency, links=links or measured_links(profile_db),
                              memory_limit=memory), getattr(fn, "__name__", type(fn).__name__))


class ShardedPlan:
    """The chosen sharding of one program: what runs where, its predicted time, and runners."""

    def __init__(self, found: Search, name: str):
        self.search, self.name, self.mesh, self.program = found, name, found.n, found.program
        self.terms = found.best.roots

    # ---- what was chosen
    def collectives(self) -> dict[str, int]:
        return self.search.best.collectives()

    @property
    def predicted_s(self) -> float:
        return self.search.best.seconds

    @property
    def unsharded_s(self) -> float:
        return self.search.original.seconds

    def placements(self) -> Table:
        """Every op of the sharded program: one device's shape and predicted time, and where its value lives."""
        best = self.search.best
        shape_of, labels = shapes(best.roots), _placements(best, self.search.classes)
        items = [t for t in postorder(best.roots) if t.args]
        rows = [[t.op, "x".join(map(str, shape_of[id(t)][0])) or "()", labels[id(t)],
                 round(best.units[best.class_of[id(t)]] * UNIT_S * 1e6, 1)] for t in items]
        return Table(f"placements over {self.mesh} devices", ["op", "shape per device", "placement",
                                                                "predicted us"], rows, items=items)

    @property
    def report(self) -> str:
        best, s = self.search.best, self.search
        return "\n".join([
            f"[SHARDING] {self.name} over {self.mesh} devices: {s.saturation.enodes} e-nodes, "
            f"{s.saturation.iterations} iterations ({s.saturation.stop})", str(self.placements()),
            f"[PREDICTED] 1 device {s.original.seconds * 1e6:.1f} us; {self.mesh} devices {best.seconds * 1e6:.1f} us "
            f"per device, of which communication {best.comm_seconds * 1e6:.1f} us ({_counts(best.collectives())})",
            f"[MEMORY] per device {best.memory / 2**20:.2f} MiB (unsharded {s.original.memory / 2**20:.2f} MiB"
            + (f", limit {s.memory_limit / 2**20:.2f} MiB)" if s.memory_limit else ")")])

    def alternatives(self, k: int = 8) -> Table:
        """The ``k`` cheapest shardings the search compares, with their predicted costs."""
        items, limit = list(self.search.candidates(k)), self.search.memory_limit
        rows = [[i, round(c.seconds * 1e6, 1), round(c.comm_seconds * 1e6, 1), round(c.memory / 2**20, 2),
                 "yes" if limit is None or c.memory <= limit else "no", _counts(c.collectives()),
                 clip(pretty(c.roots[0]), 110)] for i, c in enumerate(items)]
        return Table(f"shardings of {self.name} over {self.mesh} devices", ["#", "predicted us", "communication us",
                     "MiB per device", "fits", "collectives", "program"], rows, note=f"chosen: {pretty(self.terms[0])}",
                     items=items)

    # ---- running it
    def _env(self, args: tuple) -> dict[str, Any]:
        if len(args) != len(self.program.inputs):
            raise TypeError(f"{self.name} takes {len(self.program.inputs)} tensors, got {len(args)}")
        for t, a in zip(self.program.inputs, args):
            if not isinstance(a, torch.Tensor) or tuple(a.shape) != parse_shape(t.attrs[1]):
                raise TypeError(f"{self.name}: argument {t.attrs[0]} must be a tensor of shape "
                                f"{t.attrs[1]}, as planned, not {getattr(a, 'shape', type(a).__name__)}")
        return {**{k: v.detach() for k, v in self.program.params.items()},
                **{t.attrs[0]: a.detach() for t, a in zip(self.program.inputs, args)}}

    def _outputs(self, values: list) -> Any:
        sharded = self.program.with_roots(dict(zip(map(id, self.program.roots()), self.terms)))
        by_id = dict(zip(map(id, self.terms), values))
        return map_aggregate(sharded.outputs, lambda x: by_id[id(x)] if isinstance(x, Term) else x)

    def run(self, *args) -> Any:
        """Run on ``mesh`` torch.distributed processes (gloo or NCCL); device 0's result, the original's."""
        return self._outputs(runner.spawn(self.terms, self._env(args), self.mesh)[0])

    def run_local(self, *args) -> Any:
        """Under torchrun: this process's device runs its part; returns the (whole) result."""
        return self._outputs(runner.run_local(self.terms, self._env(args), self.mesh))

    def measure(self, *args, repeats: int = 10, sharded: bool = True, threads: int | None = None) -> float:
        """Median seconds of a run on ``mesh`` processes (``sharded=False``: unsharded, one) of ``threads`` threads."""
        terms = self.terms if sharded else self.search.original.roots
        return runner.spawn(terms, self._env(args), self.mesh if sharded else 1, repeats, threads)[1]

    def __repr__(self) -> str:
        return f"ShardedPlan({self.name}, mesh={self.mesh}, {pretty(self.terms[0])[:120]})"


def _placements(best: Candidate, classes: dict) -> dict[int, str]:
    """Where each value lives: ``whole`` on every device, ``split a`` along axis a (its e-class
    holds a shard along a), ``partial sums`` (an all-reduce adds them), or ``per device``."""
    split = {cid: f"split {n.attrs[0]}" for cid, nodes in classes.items() for n in nodes if n.op == "shard"}
    summed = {id(t.args[0]) for t in postorder(best.roots) if t.op in ("all_reduce", "reduce_scatter")}
    out: dict[int, str] = {}
    for t in postorder(best.roots):
        spec = OPS[t.op]
        out[id(t)] = f"split {t.attrs[0]}" if t.op in ("shard", "reduce_scatter") else \
            "whole" if spec.is_leaf or spec.mesh == "whole" or all(out[id(a)] == "whole" for a in t.args) else \
            "partial sums" if id(t) in summed else split.get(best.class_of[id(t)], "per device")
    return out


def _counts(found: dict[str, int]) -> str:
    return ", ".join(f"{n} {op}" for op, n in sorted(found.items())) or "none"
