"""Integer costs per node (integers keep extraction exact): conditioning from the operand ranges (``curvature.py``) and
latency from the profiling database (``latency_of``) or else a static count of passes over memory, both in tenths of a
microsecond. ``stability`` minimizes conditioning, ties broken by latency; ``latency`` the reverse; ``balanced`` adds
them (a decibel weighs a microsecond); ``tolerance``: the fastest program within a bound on per-node estimated error."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable

from egraph_opt.analysis.facts import Facts, NodeFacts
from egraph_opt.analysis.ranges import analyze
from egraph_opt.lang.ops import OPS
from egraph_opt.lang.term import Term, postorder, shapes

from .curvature import UNIT_ROUNDOFF, kappa, kappa_cost, rounding_free

PASS_UNITS = 10  # one pass ~ 1 us in latency units
LEAVES = {"input", "param", "const", "opaque"}
CONSTANT_LEAVES, HALF = {"param", "const"}, {"float16", "bfloat16"}
HALF_ACCUMULATION = 20  # decibels charged for a half-precision accumulator
#: decibels charged for rounding a result to a half-precision dtype: its unit roundoff over
#: float32's (2^13 for float16), so a program that rounds once beats one that rounds at every op
HALF_ROUNDING = {d: round(10 * math.log10(UNIT_ROUNDOFF[d] / UNIT_ROUNDOFF["float32"])) for d in HALF}
LEXICOGRAPHIC = 10 ** 12  # weight of the first criterion of stability and latency objectives
KAPPA_WEIGHT = 10  #: balanced: a decibel of conditioning costs this many latency units (a microsecond)


class Objective(enum.Enum):
    STABILITY = "stability"
    LATENCY = "latency"
    BALANCED = "balanced"
    TOLERANCE = "tolerance"

    @classmethod
    def _missing_(cls, value):
        raise ValueError(f"{value!r} is not an objective; use one of {', '.join(o.value for o in cls)}")


#: balanced: a program this many bits more accurate (sampled, worst or mean; piecewise: mean, its series' truncation
#: counted) than the fastest may take max_slowdown times its time: a catastrophic error is no trade for microseconds
ACCURATE_BY = 8.0

#: bits of a sampled first-order error that are its noise where overflow dominates it (one node for two, a fused
#: linear + gelu, moves it by a bit or two): fewer buy no time
NOISE_BITS = 2.0


def buys(gain: float, max_slowdown: float) -> float:
    """The time, as a multiple of the fastest's, that ``gain`` bits of accuracy buy: ACCURATE_BY of them all of
    ``max_slowdown``, fewer its power (4x: 4 bits buy 2x, 2 bits 1.41x), fewer than NOISE_BITS nothing."""
    return max_slowdown ** (min(gain, ACCURATE_BY) / ACCURATE_BY) if gain >= NOISE_BITS else 1.0


@dataclass(frozen=True)
class CostModel:
    objective: Objective = Objective.BALANCED
    latency_of: Callable | None = None  # (NodeFacts) -> (units, source) | None
    tolerance: float | None = None  # for Objective.TOLERANCE: largest estimated relative error
    #: for Objective.BALANCED: how many times the fastest's time a far more accurate program (``ACCURATE_BY``) may take
    max_slowdown: float = 4.0

    def __post_init__(self):
        if (self.objective is Objective.TOLERANCE) != (self.tolerance is not None):
            raise ValueError("a tolerance goes with objective 'tolerance', and only with it")
        if self.tolerance is not None and not self.tolerance > 0:
            raise ValueError(f"tolerance must be a positive relative error, not {self.tolerance!r}")
        if not self.max_slowdown >= 1:
            raise ValueError(f"max_slowdown must be a factor >= 1, not {self.max_slowdown!r}")

    def affordable(self, latency: float, fastest: float, gain: float = math.inf) -> bool:
        """Balanced: may a program ``gain`` bits more accurate take ``latency``, the fastest ``fastest`` (``buys``)."""
        return latency <= buys(gain, self.max_slowdown) * max(fastest, 1)

    def curvature(self, n: NodeFacts) -> int:
        if n.op in LEAVES or n.constant:
            return 0
        accumulates = OPS[n.op].precision == "accumulate"  # many terms: ~log2(n) bits lost in half
        half = HALF_ACCUMULATION if accumulates and n.dtypes and n.dtypes[0] in HALF else 0
        half += HALF_ROUNDING.get(n.dtype, 0) if not rounding_free(n.op, n.attrs, n.dtypes) else 0
        return half + kappa_cost(n.op, n.attrs, list(n.operands), n.result, n.dtype, n.exact)

    def latency(self, n: NodeFacts) -> int:
        if n.op in LEAVES or n.constant:
            return 0
        found = self.latency_of(n) if self.latency_of is not None and n.shapes is not None else None
        return found[0] if found else OPS[n.op].passes * PASS_UNITS  # else: passes over memory the op declares

    def error(self, n: NodeFacts) -> float:
        """Estimated relative error a node adds: unit roundoff amplified by its curvature."""
        k = kappa(n.op, n.attrs, list(n.operands))
        return UNIT_ROUNDOFF.get(n.dtype, 0.0) * (1 + k) if not math.isnan(k) else math.inf

    def __call__(self, n: NodeFacts) -> int:
        return self.combined(n, self.curvature(n), self.latency(n))

    def combined(self, n: NodeFacts, kappa_part: int, time_part: int) -> int:
        """The node's cost from its curvature and latency parts (computed once by a caller wanting both)."""
        if self.objective is Objective.STABILITY:
            return kappa_part * LEXICOGRAPHIC + time_part
        if self.objective is Objective.LATENCY:
            return time_part * LEXICOGRAPHIC + kappa_part
        if self.objective is Objective.TOLERANCE:
            over = n.op not in LEAVES and not n.constant and self.error(n) > self.tolerance
            return time_part + (LEXICOGRAPHIC if over else 0)
        return KAPPA_WEIGHT * kappa_part + time_part


def program_cost(roots: list[Term], model: CostModel, declared: dict | None = None, leaf_meta: dict | None = None,
                 meta: dict | None = None, ranges: dict | None = None) -> dict[str, int]:
    """Total cost of a program as a DAG (each term paid once), with parts; ``meta``, ``ranges``: the caller's."""
    meta = meta if meta is not None else shapes(roots, leaf_meta)
    ranges = ranges if ranges is not None else analyze(roots, declared, leaf_meta, meta)
    facts = Facts.of_program(roots, meta, model.latency_of is not None, ranges=ranges)
    parts = {"cost": 0, "curvature": 0, "latency": 0, "worst": 0}  # worst: one node's curvature
    for t in postorder(roots):
        n = facts.of(t)
        if rounding_free(t.op, t.attrs, n.dtypes) and all(n.exact):
            facts.exact.add(id(t))
        if t.op in CONSTANT_LEAVES or n.constant:
            facts.constant.add(id(t))
        kappa_part, time_part = model.curvature(n), model.latency(n)
        parts["cost"] += model.combined(n, kappa_part, time_part)
        parts["curvature"] += kappa_part
        parts["worst"] = max(parts["worst"], kappa_part)
        parts["latency"] += time_part
    return parts
