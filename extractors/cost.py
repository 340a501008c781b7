"""Integer costs per node: curvature and latency, weighted by the objective.

Curvature comes from the operand ranges (see ``curvature.py``). Latency is counted in passes over
memory and kernel launches until profiled timings replace it. Integers keep extraction exact: no
float ties, no overflow.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from egraph_opt.ranges import TOP, analyze
from egraph_opt.term import Term, dtype_name, postorder, shapes

from .curvature import ROUNDING_FREE, kappa_cost

#: relative latency: one elementwise pass = 2; reductions read and write; matmuls dominate
LATENCY = {
    "sum": 4, "max": 4, "mean": 4, "var": 6, "softmax": 5, "log_softmax": 5, "logsumexp": 5,
    "layer_norm": 6, "matmul": 16, "linear": 17, "linear_act": 17, "sdpa": 20, "sdpa_masked": 21,
    "conv2d": 24, "batch_norm": 6,
    "transpose": 1, "permute": 1, "reshape": 1, "expand": 1, "slice": 1,
}
LEAVES = {"input", "param", "const", "opaque"}
CONSTANT_LEAVES = {"param", "const"}
#: ops that accumulate over many terms: in a half-precision accumulator they lose ~log2(n) bits
ACCUMULATING = {"sum", "mean", "var", "matmul", "linear", "linear_act", "softmax", "log_softmax",
                "logsumexp", "layer_norm", "sdpa", "sdpa_masked", "conv2d"}
HALF = {"float16", "bfloat16"}
HALF_ACCUMULATION = 20  # curvature-cost units (decibels) charged for a half-precision accumulator


class Objective(enum.Enum):
    STABILITY = "stability"
    LATENCY = "latency"
    BALANCED = "balanced"


_WEIGHTS = {Objective.STABILITY: (10, 1), Objective.LATENCY: (0, 1), Objective.BALANCED: (1, 1)}


@dataclass(frozen=True)
class NodeFacts:
    """What a cost model may know of one node: its op and attributes, the intervals, dtypes and
    exactness (no rounding error) of its operands, and its own interval (None: not known) and
    dtype."""
    op: str
    attrs: tuple = ()
    operands: tuple = (TOP, TOP, TOP)
    dtypes: tuple = ()
    exact: tuple = ()
    result: tuple | None = None
    dtype: str = "float32"
    constant: bool = False  # every operand derives from parameters and constants only

    @staticmethod
    def of_op(op: str) -> NodeFacts:
        """A node with nothing known beyond its op: every range unbounded."""
        return NodeFacts(op)


@dataclass(frozen=True)
class CostModel:
    objective: Objective = Objective.BALANCED

    def curvature(self, n: NodeFacts) -> int:
        if n.op in LEAVES:
            return 0
        half = HALF_ACCUMULATION if n.op in ACCUMULATING and n.dtypes and n.dtypes[0] in HALF else 0
        return half + kappa_cost(n.op, n.attrs, list(n.operands), n.result, n.dtype, n.exact)

    def latency(self, op: str) -> int:
        return 0 if op in LEAVES else LATENCY.get(op, 2)

    def __call__(self, n: NodeFacts) -> int:
        """Cost of one node. Work on parameters alone (folding a batch norm into conv weights)
        does not depend on the data and is free: it could be computed once."""
        if n.constant:
            return 0
        w_kappa, w_time = _WEIGHTS[self.objective]
        return w_kappa * self.curvature(n) + w_time * self.latency(n.op)


def program_cost(roots: list[Term], model: CostModel, declared: dict | None = None,
                 leaf_meta: dict | None = None) -> dict[str, int]:
    """Total cost of a program as a DAG (each distinct term paid once), with its parts."""
    terms = postorder(roots)
    ranges = analyze(roots, declared, leaf_meta)
    meta = shapes(roots, leaf_meta)
    exact: dict[int, bool] = {}
    constant: dict[int, bool] = {}
    parts = {"cost": 0, "curvature": 0, "latency": 0}
    for t in terms:
        exact[id(t)] = t.op in ROUNDING_FREE and all(exact[id(a)] for a in t.args)
        constant[id(t)] = t.op in CONSTANT_LEAVES or bool(t.args) and all(constant[id(a)] for a in t.args)
        n = NodeFacts(t.op, t.attrs, tuple(ranges[id(a)] for a in t.args),
                      tuple(dtype_name(meta[id(a)][1]) for a in t.args),
                      tuple(exact[id(a)] for a in t.args), ranges[id(t)],
                      dtype_name(meta[id(t)][1]), bool(t.args) and constant[id(t)])
        parts["cost"] += model(n)
        if not n.constant:
            parts["curvature"] += model.curvature(n)
            parts["latency"] += model.latency(t.op)
    return parts
