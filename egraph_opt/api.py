"""``saturate_and_extract``: the decorator users meet first.

The first call per input signature (shapes, dtypes, devices) traces, optimizes, validates and
caches a plan; later calls with that signature run the plan. A plan that fails validation is
replaced by the original program, and the report says why.
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .capture import CaptureError, capture
from .egraph import EGraph
from .extractors import CostModel, Objective
from .extractors.rounding_error import program_error
from .latency import MeasuredLatency, sources
from .pipeline import Limits, optimize
from .report import Report
from .rulesets import select
from .term import postorder
from .torch_backend import build_module
from .validate import compare, random_inputs

#: programs of at most this many terms get a first-order error estimate in their report (it runs
#: them in float64 with derivatives at 8 points)
ESTIMATED_UP_TO = 256


@dataclass
class Plan:
    run: Callable
    report: Report
    egraph: EGraph | None


def _check_ranges(ranges: dict | None) -> dict:
    checked = {}
    for name, value in (ranges or {}).items():
        try:
            lo, hi = (float(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"input_ranges[{name!r}] must be a (lo, hi) pair of numbers, got {value!r}") from None
        if math.isnan(lo) or math.isnan(hi) or lo > hi:
            raise ValueError(f"input_ranges[{name!r}] = {value!r} is empty or not numbers")
        checked[name] = (lo, hi)
    return checked


class OptimizedFunction:
    """A callable equivalent to ``fn`` that runs the optimized program for each input signature."""

    def __init__(self, fn: Callable, *, objective="balanced", tolerance: float | None = None,
                 input_ranges=None, rulesets=None, validate: bool = True,
                 limits: Limits = Limits(), profile_db=None, profile_misses: bool = False):
        self.fn = fn
        self.objective = Objective(objective)
        self.tolerance = tolerance
        CostModel(self.objective, tolerance=tolerance)  # refuses a bad objective/tolerance now
        self.profile_db = profile_db  # path, None for the default database, False for none
        self.profile_misses = profile_misses
        self.input_ranges = _check_ranges(input_ranges)
        self.rules = select(rulesets)
        self.validate = validate
        self.limits = limits
        self._plans: dict[tuple, Plan] = {}
        self._last: Plan | None = None
        target = fn.forward if isinstance(fn, torch.nn.Module) else fn
        self._signature = inspect.signature(target)
        unknown = set(self.input_ranges) - set(self._signature.parameters)
        if unknown:
            raise ValueError(f"input_ranges names {sorted(unknown)}, which are not parameters of "
                             f"{getattr(target, '__qualname__', target)}")
        if not isinstance(fn, torch.nn.Module):
            functools.update_wrapper(self, fn)

    def _bind(self, args, kwargs) -> tuple:
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self._name}: {e}") from None
        bound.apply_defaults()
        for name, value in bound.arguments.items():
            if not isinstance(value, torch.Tensor):
                raise CaptureError(f"{self._name}: argument {name!r} is a {type(value).__name__}; "
                                   "egraph-opt optimizes functions of tensors (close over other "
                                   "values instead)")
        return tuple(bound.arguments.values())

    @property
    def _name(self) -> str:
        return getattr(self.fn, "__qualname__", type(self.fn).__name__)

    def __call__(self, *args, **kwargs):
        args = self._bind(args, kwargs)
        key = tuple((tuple(a.shape), a.dtype, a.device.type, a.device.index) for a in args)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._compile(args, key)
        self._last = plan
        return plan.run(*args)

    def _compile(self, args: tuple, key: tuple) -> Plan:
        signature = ", ".join(f"{n}: {str(d).removeprefix('torch.')}{list(s)}"
                              for n, (s, d, *_) in zip(self._signature.parameters, key))
        program, traced = capture(self.fn, args)
        device = args[0].device.type if args else "cpu"
        latency = None if self.profile_db is False else MeasuredLatency.from_database(
            self.profile_db, device, on_demand=self.profile_misses)
        model = CostModel(self.objective, latency, self.tolerance)
        result = optimize(program, rules=self.rules, model=model, limits=self.limits,
                          input_ranges=self.input_ranges)
        roots = program.roots()
        seconds_before, where_before = sources(roots, latency, program.leaf_meta())
        seconds_after, where_after = sources(result.program.roots(), latency, program.leaf_meta())
        module = build_module(result.program, traced, device=device)
        errors = [program_error(p, self.input_ranges) for p in (program, result.program)] \
            if len(postorder(roots)) <= ESTIMATED_UP_TO else []
        report = Report(
            signature=f"{self._name}({signature})",
            rewrites=[(r.name, r.describe(), n) for r, n in result.applied],
            ops_before=result.ops_before, ops_after=result.ops_after,
            cost_before=result.cost_before, cost_after=result.cost_after,
            opaque=[c.describe() for c in program.opaque.values()],
            saturation=[f"{s.phase}: {s.iterations} iterations, {s.enodes} e-nodes, stopped: "
                        f"{s.stop}" for s in result.saturation],
            seconds=result.seconds, kernels=module.kernels,
            latency=(seconds_before, seconds_after, where_after),
            error=tuple(errors) if errors and all(errors) else None)
        run: Callable = module
        if self.validate:
            names = list(self._signature.parameters)
            fresh = random_inputs(args, names, self.input_ranges)
            report.validation = compare(self.fn, module, fresh)
            if not report.validation.passed:
                report.fallback = f"validation failed: {report.validation.detail}"
                run = self.fn
        return Plan(run, report, result.egraph)

    @property
    def report(self) -> Report | None:
        """The report of the plan that ran last (None before the first call)."""
        return self._last.report if self._last else None

    @property
    def egraph(self) -> EGraph | None:
        """The saturated e-graph behind the plan that ran last."""
        return self._last.egraph if self._last else None

    @property
    def plans(self) -> dict[tuple, Plan]:
        return dict(self._plans)


def saturate_and_extract(fn: Callable | None = None, **options: Any):
    """Optimize ``fn`` (a function of tensors or an nn.Module) by equality saturation.

    Use bare (``@saturate_and_extract``) or with options: ``objective`` ("balanced", "stability",
    "latency", or "tolerance" with ``tolerance=`` a relative error), ``input_ranges``
    ({name: (lo, hi)}), ``rulesets`` (family or rule names), ``validate`` (default True),
    ``limits`` (a ``Limits``), ``profile_db`` (latency database path; None: the default one;
    False: static latencies), ``profile_misses`` (time unmeasured kernels during optimization).
    """
    if fn is None:
        return lambda f: OptimizedFunction(f, **options)
    return OptimizedFunction(fn, **options)
