"""Integer costs per e-node: a curvature term and a latency term weighted by the objective.

Curvature is ranked by growth class, so a stable form stays below its naive form even when value
ranges are unbounded (an exponential's conditioning dominates a division's, which dominates a
bounded op's). Latency is counted in kernel launches and passes over memory until profiled timings
replace it. Integers keep costs exact: no float ties, no overflow.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from egraph_opt.term import Term, postorder

#: growth class of each op's condition number over an unbounded range
CURVATURE = {
    "exp": 40, "expm1": 30, "pow": 20, "log": 20, "div": 10, "rsqrt": 10, "log1p": 8,
    "sqrt": 5, "var": 5, "tanh": 1, "sigmoid": 1, "erf": 1, "gelu": 1, "sin": 1, "cos": 1,
    "softmax": 1, "log_softmax": 1, "logsumexp": 1, "layer_norm": 2, "sdpa": 2,
}
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

    def curvature(self, op: str) -> int:
        return CURVATURE.get(op, 0)

    def latency(self, op: str) -> int:
        return 0 if op in LEAVES else LATENCY.get(op, 2)

    def __call__(self, op: str) -> int:
        w_kappa, w_time = _WEIGHTS[self.objective]
        return w_kappa * self.curvature(op) + w_time * self.latency(op)


def program_cost(roots: list[Term], model: CostModel) -> dict[str, int]:
    """Total cost of a program as a DAG (each distinct term paid once), with its parts."""
    terms = postorder(roots)
    return {"cost": sum(model(t.op) for t in terms),
            "curvature": sum(model.curvature(t.op) for t in terms),
            "latency": sum(model.latency(t.op) for t in terms)}
