"""Integer costs per node: curvature and latency, weighted by the objective.

Curvature comes from the operand ranges (see ``curvature.py``). Latency is counted in passes over
memory and kernel launches until profiled timings replace it. Integers keep extraction exact: no
float ties, no overflow.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from egraph_opt.ranges import TOP, analyze
from egraph_opt.term import Term, postorder

from .curvature import kappa_cost

#: relative latency: one elementwise pass = 2; reductions read and write; matmuls dominate
LATENCY = {
    "sum": 4, "max": 4, "mean": 4, "var": 6, "softmax": 5, "log_softmax": 5, "logsumexp": 5,
    "layer_norm": 6, "matmul": 16, "linear": 17, "sdpa": 20,
    "transpose": 1, "permute": 1, "reshape": 1, "expand": 1, "slice": 1,
}
LEAVES = {"input", "param", "const", "opaque"}


class Objective(enum.Enum):
    STABILITY = "stability"
    LATENCY = "latency"
    BALANCED = "balanced"


_WEIGHTS = {Objective.STABILITY: (10, 1), Objective.LATENCY: (0, 1), Objective.BALANCED: (1, 1)}


@dataclass(frozen=True)
class CostModel:
    objective: Objective = Objective.BALANCED

    def curvature(self, op: str, attrs: tuple = (), operands: list | None = None) -> int:
        if op in LEAVES:
            return 0
        return kappa_cost(op, attrs, operands if operands is not None else [TOP] * 3)

    def latency(self, op: str) -> int:
        return 0 if op in LEAVES else LATENCY.get(op, 2)

    def __call__(self, op: str, attrs: tuple = (), operands: list | None = None) -> int:
        w_kappa, w_time = _WEIGHTS[self.objective]
        return w_kappa * self.curvature(op, attrs, operands) + w_time * self.latency(op)


def program_cost(roots: list[Term], model: CostModel, declared: dict | None = None,
                 leaf_meta: dict | None = None) -> dict[str, int]:
    """Total cost of a program as a DAG (each distinct term paid once), with its parts."""
    terms = postorder(roots)
    ranges = analyze(roots, declared, leaf_meta)
    parts = {"cost": 0, "curvature": 0, "latency": 0}
    for t in terms:
        operands = [ranges[id(a)] for a in t.args]
        parts["cost"] += model(t.op, t.attrs, operands)
        parts["curvature"] += model.curvature(t.op, t.attrs, operands)
        parts["latency"] += model.latency(t.op)
    return parts
