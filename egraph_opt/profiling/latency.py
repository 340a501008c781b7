"""Latency of a kernel at any shape: measured where the database has it, else interpolated.

Per (kernel, backend, device, dtype), ``log t = a + b*log(bytes) + c*log(flops)`` is fitted *locally* around each query
(weighted least squares over the nearest measured shapes: one global line cannot follow a kernel from launch-bound
through cache to DRAM- or compute-bound), to the residual over a roofline default, so one measurement calibrates the
default; a ridge pulls slopes toward the roofline's where data is thin. Uncertainty: the fit's leave-one-out error.
>>> import tempfile, pathlib
>>> from egraph_opt.profiling.profile_db import ProfileDB
>>> model = LatencyModel(ProfileDB(pathlib.Path(tempfile.mkdtemp()) / "p.sqlite"))
>>> model.predict("exp", "torch", "cpu: any", "float32", [(1024, 1024)], {}).source
'default'

``MeasuredLatency`` prices one node for the cost model, in integer tenths of a microsecond (extraction stays exact). The
database is a cache: one that cannot be used costs one warning and the static estimates, never a failed compile."""
from __future__ import annotations

import math
import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from ..lang.term import postorder
from ..analysis.facts import Facts, NodeFacts
from ..analysis.layouts import layout_attr
from .profile_db import UNUSABLE, ProfileDB, ProfileDBWarning, Record, shape_key
from .profiler import (PRICED, Case, Work, attr_names, device_name, machine_busy, profile_shapes, timeable,
                       torch_dtype, work)


class Roofline(NamedTuple):
    """t = overhead + max(bytes / bandwidth, flops / throughput)."""
    overhead_s: float
    bytes_per_s: float
    flops_per_s: float


# Order-of-magnitude constants by device type (the device name before ':'): cpu: a few microseconds of dispatch,
# ~20 GB/s of memory bandwidth, ~100 GFLOP/s; cuda: ~5 us launch, ~1 TB/s of HBM, ~30 TFLOP/s (a datacenter GPU).
ROOFLINES = {"cpu": Roofline(5e-6, 2e10, 1e11), "cuda": Roofline(5e-6, 1e12, 3e13)}
DEFAULT_UNCERTAINTY = 3.0  # a roofline guess can be several times off: relative error up to ~300%
EXTRAPOLATION_FACTOR = 2.0  # flag a query whose bytes or FLOPs lie this far beyond the measured range
NEIGHBOURS = 4  # the local fit's bandwidth is the distance to the NEIGHBOURS-th nearest measurement
RIDGE = 1e-2  # pull of the local slopes toward the roofline's, relative to the total weight
_FEATURES = ("bytes", "FLOPs")


@dataclass(frozen=True)
class Estimate:
    """Seconds per call; `source`: "measured" (this shape), "interpolated" (from the kernel's other
    shapes) or "default" (roofline); `uncertainty`: relative (0.1: +-10%); `note`: why to beware."""
    seconds: float
    source: str
    uncertainty: float
    note: str = ""
    extrapolated: bool = False
    config: Mapping[str, object] | None = None  # the kernel's fastest configuration at the nearest measured shape


def roofline_seconds(w: Work, itemsize: int, device: str) -> float:
    """The default latency of work `w` on `device` (a device name such as 'cpu: <model>')."""
    if (kind := device.split(":", 1)[0].strip()) not in ROOFLINES:
        raise ValueError(f"device {device!r}: no roofline constants for device type {kind!r}; "
                         f"known: {', '.join(ROOFLINES)}")
    roof = ROOFLINES[kind]
    return roof.overhead_s + max(w.elements * itemsize / roof.bytes_per_s, w.flops / roof.flops_per_s)


#: a row this many times its roofline default timed the scheduler (other processes held the cores): never used
IMPLAUSIBLE = 200.0
#: a row this many times what the rows around it predict timed a loaded moment too (Llama's grouped attention at 9
#: tokens 55 us, at 8 and 10 tokens 23 us: repeating its keys to every head, 9 us more, was priced cheaper there)
OUTLIER = 1.5


def interference(record: Record, w: Work) -> float | None:
    """How many times its roofline ``record`` took, where that is beyond ``IMPLAUSIBLE``."""
    ratio = record.median_s / roofline_seconds(w, torch_dtype(record.dtype).itemsize, record.device)
    return ratio if ratio > IMPLAUSIBLE else None


def _features(w: Work, itemsize: int) -> np.ndarray:
    return np.log([max(w.elements * itemsize, 1.0), max(w.flops, 1.0)])


def _local_fit(z: np.ndarray, y: np.ndarray, query: np.ndarray) -> float:
    """Weighted least squares of y on [1, z - query] around `query`; returns the intercept."""
    d = np.linalg.norm(z - query, axis=1)
    h = max(np.sort(d)[min(NEIGHBOURS, len(d)) - 1], 1e-3)
    w, x = np.exp(-0.5 * (d / h) ** 2), np.hstack([np.ones((len(d), 1)), z - query])
    gram = (x.T * w) @ x + RIDGE * w.sum() * np.diag([0.0] + [1.0] * z.shape[1])
    return float(np.linalg.solve(gram, (x.T * w) @ y)[0])


def _work_of(kernel: str, record: Record) -> Work | None:
    """The work of a recorded call, or None for a row no work formula reads: a cache row is never a reason to fail."""
    try:
        return work(kernel, record.shapes, record.attrs)
    except (TypeError, ValueError, KeyError, IndexError, RuntimeError):
        return None


class _Group:
    """The measurements of one (kernel, backend, device, dtype), as features and residuals. Where the group holds
    enough rows to tell, one ``OUTLIER`` times what its neighbours predict timed a loaded moment (noise only slows):
    left out, so its shape is interpolated, and timed again where a budget allows."""

    def __init__(self, device: str, itemsize: int, rows: list[tuple[Record, Work]]):
        self.z = np.array([_features(w, itemsize) for _, w in rows])
        self.y = np.log([r.median_s / roofline_seconds(w, itemsize, device) for r, w in rows])
        errors = self._errors()
        if len(rows) > 2 * NEIGHBOURS and (slow := errors > math.log(OUTLIER)).any() and not slow.all():
            rows, self.z, self.y = [row for row, out in zip(rows, slow) if not out], self.z[~slow], self.y[~slow]
            errors = self._errors()  # of the rows kept
        self.exact, self.lo, self.hi = {r.shape_key: r for r, _ in rows}, self.z.min(axis=0), self.z.max(axis=0)
        self.uncertainty = float(math.expm1(math.sqrt(np.mean(np.square(errors))))) if len(rows) > 1 \
            else DEFAULT_UNCERTAINTY  # of predicting each measurement from the others

    def _errors(self) -> np.ndarray:
        """Each row's log error predicted from the others (none for a single row)."""
        keep = ~np.eye(n := len(self.y) if len(self.y) > 1 else 0, dtype=bool)
        return np.array([self.y[i] - _local_fit(self.z[keep[i]], self.y[keep[i]], self.z[i]) for i in range(n)])

    def extrapolation(self, query: np.ndarray) -> str:
        """A note when `query` lies far outside the measured range of a feature, else ''."""
        below, above = self.lo - query, query - self.hi
        i = int(np.argmax(np.maximum(below, above)))
        if (excess := max(below[i], above[i])) <= math.log(EXTRAPOLATION_FACTOR):
            return ""
        side = "below the smallest" if below[i] > above[i] else "above the largest"
        return (f"extrapolated: {_FEATURES[i]} {math.exp(excess):.1f}x {side} measured "
                f"(over {len(self.y)} measured shapes)")


class LatencyModel:
    """Reads each (kernel, backend, device, dtype) once, on its first prediction: a new model sees new rows."""

    def __init__(self, db: ProfileDB):
        self.db = db
        self._groups: dict[tuple[str, str, str, str], _Group | None] = {}

    def _group(self, kernel: str, backend: str, device: str, dtype: str, itemsize: int, layout) -> _Group | None:
        """The rows of one kernel whose operands had ``layout``: across layouts a fit averages unlike runs."""
        key = (kernel, backend, device, dtype, str(layout))
        if key not in self._groups:
            rows = [(r, _work_of(kernel, r)) for r in self.db.records(*key[:4]) if r.attrs.get("layout") == layout]
            rows = [(r, w) for r, w in rows if w is not None and not interference(r, w)]
            self._groups[key] = _Group(device, itemsize, rows) if rows else None
        return self._groups[key]

    def predict(self, kernel: str, backend: str, device: str, dtype: str, input_shapes: Sequence[Sequence[int]],
                attrs: Mapping[str, object] | None = None) -> Estimate:
        """Seconds per call of `kernel` on inputs of these shapes, attributes and dtype."""
        attrs, itemsize = dict(attrs or {}), torch_dtype(dtype).itemsize
        w = work(kernel, input_shapes, attrs)
        default = roofline_seconds(w, itemsize, device)
        if (group := self._group(kernel, backend, device, dtype, itemsize, attrs.get("layout"))) is None:
            note = f"no measurements of {kernel} ({backend}, {dtype}) on {device}: roofline default"
            return Estimate(default, "default", DEFAULT_UNCERTAINTY, note)
        if (measured := group.exact.get(shape_key(input_shapes, attrs))) is not None:
            return Estimate(measured.median_s, "measured", measured.spread_s / measured.median_s, config=measured.config)
        query = _features(w, itemsize)
        note, seconds = group.extrapolation(query), default * math.exp(_local_fit(group.z, group.y, query))
        nearest = list(group.exact.values())[int(np.argmin(np.linalg.norm(group.z - query, axis=1)))]  # one a shape
        return Estimate(seconds, "interpolated", group.uncertainty, note, bool(note), nearest.config)


UNIT_S = 1e-7  # one cost unit of latency

#: seconds one optimize call may spend timing kernels the database has not measured
DEFAULT_BUDGET_S, BUDGET_VAR = 2.0, "EGRAPH_OPT_PROFILE_BUDGET"


def budget_seconds(text: str) -> float | None:
    """A profiling budget written as text: finite seconds >= 0, else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value < math.inf else None


def default_budget() -> float:
    """$EGRAPH_OPT_PROFILE_BUDGET seconds if set (0: never time), else ``DEFAULT_BUDGET_S``."""
    text = os.environ.get(BUDGET_VAR)
    budget = DEFAULT_BUDGET_S if text is None else budget_seconds(text)
    if budget is None:
        raise ValueError(f"${BUDGET_VAR} must be a number of seconds >= 0, not {text!r}")
    return budget


#: calls of a kernel that profiling it takes at least (3 to warm up, 1 to size a sample, 5 timed):
#: one predicted to overrun the budget left is not profiled (a large input's GEMM takes seconds)
PROFILE_CALLS = 9


@dataclass
class MeasuredLatency:
    """Callable ``(NodeFacts) -> (units, source)`` for ops the profiler knows; an unmeasured shape is timed
    and recorded while ``budget_s`` lasts (the database's rule), so a second call measures nothing."""
    db: ProfileDB | None  # None once it failed: static estimates from then on
    device: str = "cpu"
    budget_s: float = 0.0
    spent_s: float = 0.0
    profiled: int = 0  # kernels timed by this object
    busy: str | None = None  # why nothing more was timed: the machine was busy (machine_busy)
    _cache: dict = field(default_factory=dict)

    def __post_init__(self):
        self.model, self.where = LatencyModel(self.db), device_name(self.device)

    def _busy(self) -> bool:
        """A busy machine's timings would be kept as this machine's: time nothing more."""
        self.busy = self.busy or machine_busy()
        return self.busy is not None

    @staticmethod
    def from_database(path=None, device: str = "cpu", budget_s: float = 0.0) -> MeasuredLatency | None:
        """None (static estimates) when the database cannot be used."""
        try:
            return MeasuredLatency(ProfileDB(path), device, budget_s)
        except UNUSABLE as e:
            without_database(e)
            return None

    def __call__(self, n: NodeFacts, kernel=None, choice: bool = True, tuned: bool = False):
        """Units and source of ``n``'s op's torch kernel, or of ``kernel`` (its own rows). A node's only kernel is timed
        in the budget's first half, the rest left for choices; ``tuned``: ``kernel``'s fastest configuration nearby."""
        op, attrs, shapes, dtype, layouts = n.op, n.attrs, n.shapes, n.dtype, n.layouts
        if op not in PRICED or self.db is None:
            return None
        backend = "torch" if kernel is None else kernel.db_backend
        key = (op, attrs, shapes, dtype, layouts, backend)
        if key not in self._cache:
            named = {**dict(zip(attr_names(op), attrs)), **layout_attr(layouts)}
            try:
                est = self.model.predict(op, backend, self.where, dtype, shapes, named)
                budget = self.budget_s if choice else self.budget_s / 2
                if est.source != "measured" and timeable(op, shapes) and \
                        self.spent_s + PROFILE_CALLS * est.seconds < budget and not self._busy():
                    start = time.perf_counter()
                    (record,) = profile_shapes([Case(op, dtype, shapes, named)], self.device, self.db, repeats=5,
                                               progress=False, kernel=kernel,  # tuning, compiles too, in the budget
                                               budget_s=budget - self.spent_s - PROFILE_CALLS * est.seconds)
                    self.spent_s += time.perf_counter() - start
                    self.profiled += 1
                    if not interference(record, work(op, shapes, named)):  # else: out of the fits too
                        est = Estimate(record.median_s, "measured", 0.0, config=record.config)
                self._cache[key] = (max(1, round(est.seconds / UNIT_S)), est.source, est.config)
            except UNUSABLE as e:  # broke after opening (a bad page, a failed write): stop asking
                without_database(e)
                self.db = None
                return None
            except (KeyError, ValueError, IndexError, RuntimeError, TypeError):  # shapes it cannot read
                self._cache[key] = None
        found = self._cache[key]
        return found and (found[2] if tuned else found[:2])


def without_database(error: Exception) -> None:
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    warnings.warn(f"profile database unusable, using static latency estimates: {message}",
                  ProfileDBWarning, stacklevel=3)


def sources(program, latency: MeasuredLatency | None) -> tuple[float, dict[str, int]]:
    """A program's estimated seconds (ops the database knows) and whether measured, interpolated, default or static."""
    facts = Facts.of_program(program.roots(), program.meta())
    total, where = 0.0, Counter()
    for t in [t for t in postorder(program.roots()) if t.args]:
        if latency and (found := latency(facts.of(t))):
            total += found[0] * UNIT_S
            where[found[1]] += 1
        else:
            where["static"] += 1
    return total, dict(sorted(where.items()))
