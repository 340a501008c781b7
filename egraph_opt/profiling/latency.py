"""Latency of one node for the cost model: from the profiling database where it knows the kernel,
from the op's static pass count where it does not.

Predictions are cached per (op, shapes, dtype, attributes): an e-graph asks for the same shapes
many times. Costs are integers in tenths of a microsecond, so extraction stays exact.

The database is a cache: one that cannot be opened, read or written costs one warning and the
static estimates, never a failed compile.
"""
from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field

from .latency_model import Estimate, LatencyModel
from ..lang.ops import OPS
from .profile_db import UNUSABLE, ProfileDB, ProfileDBWarning
from .profiler import SPECS, Case, device_name, profile_shapes
from ..lang.term import dtype_name, postorder

UNIT_S = 1e-7  # one cost unit of latency


@dataclass
class MeasuredLatency:
    """Callable ``(op, attrs, shapes, dtype) -> (units, source)`` for ops the profiler knows.
    With ``on_demand``, a shape the database has not measured is timed now and recorded."""
    db: ProfileDB | None  # None once it failed: static estimates from then on
    device: str = "cpu"
    on_demand: bool = False
    _cache: dict = field(default_factory=dict)

    def __post_init__(self):
        self.model = LatencyModel(self.db)
        self.where = device_name(self.device)

    @staticmethod
    def from_database(path=None, device: str = "cpu", on_demand: bool = False
                      ) -> MeasuredLatency | None:
        """None (static estimates) when the database cannot be used."""
        try:
            return MeasuredLatency(ProfileDB(path), device, on_demand)
        except UNUSABLE as e:
            _without_database(e)
            return None

    def __call__(self, op: str, attrs: tuple, shapes: tuple, dtype: str) -> tuple[int, str] | None:
        if op not in SPECS or self.db is None:
            return None
        key = (op, attrs, shapes, dtype)
        if key not in self._cache:
            named = {name: value for (name, _), value in zip(OPS[op].attrs, attrs)}
            try:
                est = self.model.predict(op, "torch", self.where, dtype, shapes, named)
                if self.on_demand and est.source != "measured":
                    (record,) = profile_shapes([Case(op, dtype, shapes, named)], self.device,
                                               self.db, repeats=5, progress=False)
                    est = Estimate(record.median_s, "measured", 0.0)
                self._cache[key] = (max(1, round(est.seconds / UNIT_S)), est.source)
            except UNUSABLE as e:  # broke after opening (a bad page, a failed write): stop asking
                _without_database(e)
                self.db = None
                return None
            except (KeyError, ValueError, IndexError, RuntimeError):  # shapes it cannot read
                self._cache[key] = None
        return self._cache[key]


def _without_database(error: Exception) -> None:
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    warnings.warn(f"profile database unusable, using static latency estimates: {message}",
                  ProfileDBWarning, stacklevel=3)


def sources(program, latency: MeasuredLatency | None) -> tuple[float, dict[str, int]]:
    """Estimated seconds of a program (ops the database knows) and where the estimates come from:
    measured, interpolated, default (roofline), or static (no work formula for the op)."""
    meta = program.meta()
    total, where = 0.0, Counter()
    for t in postorder(program.roots()):
        if not t.args:
            continue
        operands = tuple(meta[id(a)][0] for a in t.args if a.op != "const")
        found = latency(t.op, t.attrs, operands, dtype_name(meta[id(t)][1])) if latency else None
        if found:
            total += found[0] * UNIT_S
            where[found[1]] += 1
        else:
            where["static"] += 1
    return total, dict(sorted(where.items()))
