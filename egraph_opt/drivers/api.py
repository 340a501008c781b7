"""``saturate_and_extract``: the first call per input signature (shapes, dtypes, devices) traces, optimizes, validates
and caches a plan; later calls run it. A plan that fails validation is replaced by the original, and the report says
why."""
from __future__ import annotations

import contextlib
import functools
import inspect
import math
import threading
import types
import warnings
import weakref
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
# torch.compile's own check that tensors have a type, dispatch keys, dtype, device, grad, sizes and strides: one C++
# call, cheaper than the Python key after a kernel has run (which evicts the interpreter's data from the caches)
from torch._C._dynamo.guards import TensorGuards as _Exact
from torch.utils._pytree import TreeSpec, tree_leaves, tree_structure, tree_unflatten

from .arguments import Binder, BoundCall, Into, Layout, _tensor_key
from .families import REACH, Apart, Families, Sample, at, shared
from ..frontends.capture import SideEffect, cache_pytrees, capture, capturing, free_sizes, returned
from ..egraph.engine import EGraph, InvariantError
from .plan_key import StateKey, Watch, around
from ..extractors import CostModel, Objective
from ..extractors.cost import KAPPA_WEIGHT, buys
from ..extractors.rounding_error import bits_gained, lost_alike, program_error
from ..profiling.latency import UNIT_S, MeasuredLatency, default_budget, sources
from ..profiling.profiler import time_side_by_side
from ..egraph.session import Limits
from ..optimization.derivation import Derivation
from ..optimization.pipeline import Optimized, optimize
from .explore import ESTIMATED_UP_TO, range_hints
from ..rulesets import Family, catalogue, select
from ..lang.program import Program
from ..lang.term import postorder
from ..backends.torch_backend import build_module
from ..kernels.binding import Pricing, measured_estimate
from ..kernels.torch_ops import speculating
from ..validate import Validation, compare, random_inputs, run_counting_writes, wide_reference

#: programs of at most ``ESTIMATED_UP_TO`` terms (the explorer's bound too), and this many elements over all their
#: values, get a first-order error estimate in their report (float64 runs with derivatives at 8 points)
ESTIMATED_ELEMENTS = 1 << 22

_MISS = object()  # what ``_again`` returns for a call it finds no plan for without binding
_FAMILY = object()  # a plan's guard that checks its size family's sizes (``Variable.check``)


#: plans one decorated program keeps at most (input signatures and states together; the least recently used goes)
MAX_PLANS = 256
#: plans traced for tensors of one set of shapes at most, each for other constants (torch.compile's recompile limit):
#: a number that changes every call (a sliding window StaticCache's count of tokens) would trace every call
RETRACES = 8
#: a program measured this much slower than the original is slower beyond noise (medians of interleaved calls)
SLOWER_BY = 1.02

ACCURATE_FAMILIES = frozenset({Family.STABILITY, Family.SERIES})  #: the families whose rules are there for accuracy


@dataclass
class Report:
    """What an optimization changed, as the user reads it: rewrites, ops, costs, validation."""
    signature: str
    rewrites: list[tuple[str, str, int]] = field(default_factory=list)  # name, lhs -> rhs, matches
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    cost_before: dict[str, int] = field(default_factory=dict)
    cost_after: dict[str, int] = field(default_factory=dict)
    opaque: list[str] = field(default_factory=list)
    saturation: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, int] = field(default_factory=dict)  # kernels the plan binds, by name
    latency: tuple | None = None  # (seconds before, seconds after, sources of the estimates after,
    # (kernels timed during this optimize, seconds it took, why timing stopped early or None))
    error: tuple | None = None  # first-order rounding error (ProgramError) before and after
    validation: Validation | None = None
    measured: list | None = None  # seconds of the original and the optimized, timed side by side
    backward: bool = False  # timed with the backward of what needs a gradient (autograd recorded)
    fallback: str = ""  # why the original program is running instead, if it is
    bounded: list[str] = field(default_factory=list)  # work that ran on a sample or not at all, and why
    derivation: Derivation | None = None  # the steps the [REWRITE] lines are read from
    ranges: list[str] = field(default_factory=list)  # guarded rules a declared input range would let fire
    sizes: str = ""  # the sizes its plan serves, made from its size family (``families.py``)

    def to_html(self, path) -> str:
        """Write this report as one self-contained HTML page; returns the path."""
        from .pictures import write_report
        from .usage import require
        require("report", "Report.to_html")  # its pictures: refused, not dropped
        return write_report(self, path)

    @property
    def optimized(self) -> bool:
        return not self.fallback

    def __str__(self) -> str:
        lines = [f"egraph-opt report for {self.signature}"]
        if self.fallback and not self.ops_before:  # nothing was captured: the why is all there is
            return "\n".join(lines + [f"[FALLBACK] running the original program: {self.fallback}"])
        lines += [f"[REWRITE] {name}: {what}  ({n} matches)" for name, what, n in self.rewrites]
        unexplained = self.derivation is not None and not self.derivation.complete
        lines += ["[REWRITE] none: no rule improved the program"] * (not self.rewrites and not unexplained)
        if unexplained:  # the e-graph proved the output equal; the replay did not find every step
            lines.append(f"[REWRITE] steps not replayed up to: {self.derivation.unexplained}")
        if self.derivation is not None:  # a piecewise program: each regime and its form
            lines += [f"[REGIME] {label}" for label, _ in self.derivation.branches]
        lines += [f"[RANGES] {hint}" for hint in self.ranges]
        lines.append(f"[OPS] before: {_counts(self.ops_before)}")
        lines.append(f"[OPS] after:  {_counts(self.ops_after)}")
        lines += [f"[COST] {part}: {self.cost_before[part]} -> {self.cost_after[part]}"
                  for part in ("curvature", "latency") if part in self.cost_before]
        if self.latency:
            before, after, where, (timed, seconds, busy) = self.latency
            lines.append(f"[LATENCY] estimated {before * 1e6:.1f} us -> {after * 1e6:.1f} us "
                         f"({', '.join(f'{k} {v}' for k, v in where.items())}; "
                         f"{timed} kernels profiled now in {seconds:.2f} s{f'; no more: {busy}' if busy else ''})")
        if self.error:
            before, after = self.error
            lines.append(f"[ERROR] first-order estimate over the input ranges: worst {before.worst:.1f} -> "
                         f"{after.worst:.1f} bits, mean {before.mean:.2f} -> {after.mean:.2f} bits"
                         + " (where neither form works: no verdict; declare input_ranges)" * lost_alike(before, after))
        lines += [f"[KERNELS] {_counts(self.kernels)}"] * bool(self.kernels)
        lines += [f"[OPAQUE] {o}" for o in self.opaque]
        lines += [f"[SATURATION] {s}" for s in self.saturation]
        lines += ["[TIME] " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.seconds.items())] * bool(self.seconds)
        lines += self._measured()
        if (v := self.validation) is not None:
            lines.append(f"[VALIDATION] {'passed' if v.passed else 'FAILED'}: max error {v.max_error:.3g} "
                         f"(original {v.original_error:.3g}){' - ' + v.detail if v.detail else ''}")
        lines += [f"[BOUNDED] {b}" for b in self.bounded]
        lines += [f"[SIZES] {self.sizes}"] * bool(self.sizes)
        return "\n".join(lines + [f"[FALLBACK] running the original program: {self.fallback}"] * bool(self.fallback))

    __repr__ = __str__

    def _measured(self) -> list[str]:
        """The side-by-side timing, and what accuracy a plan kept though slower cost in time."""
        if not self.measured:
            return []
        before, after = self.measured
        lines = [f"[MEASURED] original {before * 1e6:.1f} us, optimized {after * 1e6:.1f} us "
                 f"({before / after:.2f}x), interleaved on the example inputs"
                 + ", each with its backward" * self.backward]
        then, now = self.error or (None, None)
        if then and after > before and not self.fallback and now.worst <= then.worst and now.mean <= then.mean \
                and (now.worst, now.mean) != (then.worst, then.mean):  # kept for its accuracy
            lines.append(f"[TRADE] accuracy bought with time: error worst {then.worst:.1f} -> "
                         f"{now.worst:.1f} bits, mean {then.mean:.2f} -> {now.mean:.2f} bits, "
                         f"for {after / before:.2f}x the original's time")
        return lines


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} x{n}" for op, n in counts.items()) or "(none)"


def for_accuracy(result: Optimized) -> bool:
    """Whether a static conditioning gain of ``result`` can be one: its derivation applies a rule made for accuracy
    (where not known in full: one matched). A fusion alone buys none: a slower fused plan must not pass for a steadier
    one."""
    derivation = result.derivation
    if derivation is not None and derivation.complete:
        return any(step.rule.family in ACCURATE_FAMILIES for step in derivation.steps)
    known, matched = catalogue(), {name for s in result.saturation for name, n in s.matches.items() if n}
    return any(name not in known or known[name].family in ACCURATE_FAMILIES for name in matched)


def slower_for_nothing(objective: Objective, result: Optimized, original_s: float, optimized_s: float,
                       error: tuple | None = None, max_slowdown: float = 4.0, slower_by: float = SLOWER_BY) -> bool:
    """Whether a program timed slower than the original by more than noise (``slower_by``) gives way
    to it: unless it buys stability the objective asked for (stability and tolerance always; latency
    never; balanced where an ``error`` (before, after) was sampled, by bits that buy the time (``cost.buys``), as at
    extraction; else where a rule for accuracy made the worst-conditioned node better, by a decibel per microsecond.
    A lower total alone buys no time: Qwen2-MoE's compensated routing sums, 19,000 decibels, kept a 0.88x step)."""
    if optimized_s <= original_s * slower_by or objective in (Objective.STABILITY, Objective.TOLERANCE):
        return False
    if objective is Objective.BALANCED and optimized_s > original_s * max_slowdown:
        return True
    if objective is Objective.LATENCY:
        return True
    if error and not lost_alike(*error):  # a sampled error decides where it tells the forms apart: it measures what
        gain = bits_gained(*error)  # the static estimate predicts (PatchTST's compensated sums: 4,000 dB, 0 bits, 0.89x)
        return not (gain >= 1 and optimized_s <= original_s * buys(gain, max_slowdown))
    before, after = result.cost_before, result.cost_after
    gained = before.get("curvature", 0) - after.get("curvature", 0)  # decibels
    return not (for_accuracy(result) and after.get("worst", 0) < before.get("worst", 0)
                and gained * KAPPA_WEIGHT * UNIT_S >= optimized_s - original_s)


@dataclass
class Plan:
    run: Callable | None  # None: the original runs untouched (``report.fallback`` says why)
    report: Report
    egraph: EGraph | None
    optimized: Optimized | None = None  # what ``explore`` reads; dropped with the e-graph
    again: Callable = lambda args, kwargs: _MISS  # its fast path (``_fast``)
    guard: tuple = (lambda *tensors: False, None)  # the C++ check of its first call's tensors, and its state
    next: Callable = lambda: None  # a weak reference to the plan its fast path found by key last (a decode step's)
    after: Callable = lambda: None  # one to the fast path of the plan of the call that last followed its (laid out otherwise)
    key: tuple = ()  # its key in the plan cache
    returned: tuple = ()  # arguments rebuilt from their leaves that the original returns as themselves
    into: Into | None = None  # what a call returns where ``returned`` names any
    writes: tuple = ()  # the arguments it writes back: a call where one shares memory with another runs the original


@dataclass
class _Ran:
    out: Any  # what the original returned, run in place of a plan


_CHANGES = "changes Python state"


def _changes(name: str, changes: list[str]) -> str:
    return f"{name} {_CHANGES} ({', '.join(changes[:3])}{', ...' if len(changes) > 3 else ''}), " \
        "which a plan would not do on every call"


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


def unchanged(before: Program, after: Program) -> bool:
    """Whether ``after`` is ``before`` term for term (attributes by their repr: -0.0 is not 0.0)."""
    table, ids = {}, {}  # structure -> number, term id -> its structure's number
    for t in postorder(before.roots() + after.roots()):
        ids[id(t)] = table.setdefault((t.op, tuple(ids[id(a)] for a in t.args), repr(t.attrs)), len(table))
    return [ids[id(t)] for t in before.roots()] == [ids[id(t)] for t in after.roots()]


def _and_backward(fn: Callable) -> Callable:
    """``fn`` and its outputs' gradients w.r.t. the leaves they reach (found once): a training step, no .grad written."""
    leaves: list = []

    def step(*args):
        outs = [o for o in tree_leaves(fn(*args)) if isinstance(o, torch.Tensor) and o.grad_fn is not None]
        todo, seen = [o.grad_fn for o in outs] if outs and not leaves else [], set()
        while todo:  # autograd's graph, to the leaves it accumulates into
            if (node := todo.pop()) is not None and node not in seen:
                seen.add(node)
                todo += [f for f, _ in node.next_functions]
        leaves.extend(node.variable for node in seen if hasattr(node, "variable"))
        if outs and leaves:
            torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs], allow_unused=True)
    step.leaves = leaves
    return step


def runner(module: torch.fx.GraphModule, returns: TreeSpec) -> Callable:
    """The built module's generated code called directly (Module.__call__ and fx's wrapper cost microseconds; no hook is
    on a module only this plan holds), its outputs as the original returned them (a ``ModelOutput`` stays one)."""
    forward = speculating(module.forward, module.writes)
    return (lambda *args: forward(*args)[0]) if returns.is_leaf() else \
        (lambda *args: tree_unflatten(forward(*args), returns))


def _into(call: BoundCall, module: torch.fx.GraphModule, returns: TreeSpec) -> Into | None:
    return Into(speculating(module.forward, module.writes), returns) if call.returned and returns.num_children else None


def _shared(tensors: tuple, writes: tuple) -> bool:
    """Whether an argument a plan writes shares memory with another (``f(x, x)``): the plan reads the other's old values
    (traced apart), the original its new ones."""
    memory = [t.untyped_storage().data_ptr() for t in tensors]
    return any(memory[i] and memory.count(memory[i]) > 1 for i in writes)


def _autocast() -> tuple:
    """Autocast's state (ops run in a lower precision): a plan made under it is made for it. Not
    in a plan's ``state``: the fast path's tensor check sees autocast (a dispatch key)."""
    return tuple((device, torch.get_autocast_dtype(device)) for device in ("cpu", "cuda")
                 if torch.is_autocast_enabled(device)) if torch._C._is_any_autocast_enabled() else ()


class OptimizedFunction:
    """``fn``, run as its optimized program per input signature; untouched (the report says why) where that cannot be
    sound (it mutates arguments or state, cannot be traced, takes values Terms lack) or fails validation."""

    def __init__(self, fn: Callable, *, objective="balanced", tolerance: float | None = None,
                 input_ranges=None, rulesets=None, validate: bool = True,
                 limits: Limits = Limits(), profile_db=None, profile_budget: float | None = None,
                 keep_egraph: bool = False, max_slowdown: float = 4.0):
        self._options = {k: v for k, v in locals().items() if k not in ("self", "fn")}  # every keyword, as given
        self.fn = fn
        self._bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # instance -> its method
        self._held: dict[int, tuple] = {}  # the same, for instances that cannot be weakly referred to
        self.objective, self.tolerance, self.max_slowdown = Objective(objective), tolerance, max_slowdown
        CostModel(self.objective, tolerance=tolerance, max_slowdown=max_slowdown)  # refuses bad ones now
        self.profile_db = profile_db  # path, None for the default database, False for none
        self.profile_budget = default_budget() if profile_budget is None else float(profile_budget)
        if not self.profile_budget >= 0:
            raise ValueError(f"profile_budget must be seconds >= 0, not {profile_budget!r}")
        self.input_ranges, self.rules = _check_ranges(input_ranges), select(rulesets)
        self.validate, self.limits, self.keep_egraph = validate, limits, keep_egraph  # keep_egraph: every plan's, else the last's
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()  # least recently used first
        self._compiling = threading.RLock()  # one first call at a time: others wait for its plan
        self._last: Plan | None = None
        self._again: Callable[[tuple, dict], Any] = Plan.again  # the last plan, if a call is its again
        self._state, self._families, self._traced = StateKey(fn), Families(), Counter()
        target = fn.forward if isinstance(fn, torch.nn.Module) else fn
        try:
            self._signature: inspect.Signature | None = inspect.signature(target)
        except (TypeError, ValueError):  # a builtin such as torch.exp: positional tensors only
            self._signature = None
        if unknown := set(self.input_ranges) - set(self._signature.parameters if self._signature else ()):
            raise ValueError(f"input_ranges names {sorted(unknown)}, which are not parameters of "
                             f"{getattr(target, '__qualname__', target)}")
        if not isinstance(fn, torch.nn.Module):
            functools.update_wrapper(self, fn)
            self.__signature__ = self._signature  # inspect.signature unwraps it in 22 us: generate() asks 4 times
        self._bind = Binder(self._signature, self._name)

    def __reduce__(self):  # a copy or pickle (deepcopy, torch.save): the original's, decorated anew (plans are a cache)
        return functools.partial(saturate_and_extract, **self._options), (self.fn,)

    def __get__(self, instance: Any, owner: type | None = None):
        """A decorated method: each instance gets an optimized method, so its modules and attributes key its plans."""
        if instance is None:
            return self
        try:
            bound = self._bound.get(instance)
        except TypeError:  # unhashable or not weakly referable: held by identity (and kept alive)
            if id(instance) not in self._held:
                self._held[id(instance)] = (self._method(instance), instance)
            return self._held[id(instance)][0]
        return bound if bound is not None else self._bound.setdefault(instance, self._method(instance))

    def _method(self, instance: Any) -> OptimizedFunction:
        return OptimizedFunction(types.MethodType(self.fn, instance), **self._options)

    @property
    def _name(self) -> str:
        return getattr(self.fn, "__qualname__", None) or getattr(self.fn, "__name__", None) or type(self.fn).__name__

    def __call__(self, *args, **kwargs):
        out = self._again(args, kwargs)  # laid out as the last call: C++ checks of the tensors, the state
        if out is _MISS and self._last is not None and (after := self._last.after()):  # else as the call that followed
            out = after(args, kwargs)  # it last (a prefill's decode)
        if out is not _MISS:
            return out
        if capturing():  # called in another program's trace (it holds the capture): inlined there
            return self.fn(*args, **kwargs)
        call = self._bind(args, kwargs)
        try:
            key = call.key + self._state.key() + _autocast()
            plan = self._plans.get(key)
        except TypeError:  # a number the trace read now holds an unhashable value: no plan is keyed by it
            return self.fn(*args, **kwargs)
        if plan is None:
            with self._compiling:
                plan = self._plans.get(key) or self._serving(call, key) or self._first(call, args, kwargs)
            if isinstance(plan, _Ran):
                return plan.out
        with contextlib.suppress(KeyError):  # another thread dropped it meanwhile
            self._plans.move_to_end(plan.key)
        if self._last is not None and self._last is not plan:
            self._last.after = weakref.ref(plan.again)
        self._remember(plan)
        return self._ran(plan, call.tensors, call.arguments, args, kwargs)

    def _ran(self, plan: Plan, tensors, arguments: dict, args: tuple, kwargs: dict):
        """What ``plan`` returns for a call of ``tensors`` (``arguments``: the call's by name)."""
        if plan.run is None or plan.writes and _shared(tensors, plan.writes):
            return self.fn(*args, **kwargs)
        return plan.run(*tensors) if plan.into is None else \
            plan.into(tensors, [arguments[name] for name in plan.returned])  # a KV cache it updates and returns

    def _serving(self, call: BoundCall, key: tuple) -> Plan | None:
        """The plan serving ``key``'s size family where its guard takes this call (the fast path finds it next): a new
        prompt's length met by the slow path is not made and validated again (two plans a generation: 0.58x eager)."""
        plan = (found := self._families.find(key)) and found[1].serving
        return plan if plan and plan.guard[0] and plan.guard[0](*call.tensors) else None

    def _first(self, call: BoundCall, args: tuple, kwargs: dict):
        """Optimize for ``call`` and keep the plan (within ``MAX_PLANS``, least recently used out); where the original
        runs instead, its result (``_Ran``). The optimizer's runs leave no Python state: a program that changes any
        falls back."""
        before = self._state.snapshot()
        layout = call.layout(args, kwargs)  # before the original runs: it may update an argument (a KV cache)
        cache_pytrees()  # its import sets transformers' lazy attributes: not the program's effect
        plan = self._compile(call, call.key + self._state.key() + _autocast())
        ran = (self.fn(*args, **kwargs),) if plan.run is None or call.numbered and plan.into else ()  # what it writes
        if ran and plan.run is not None and (why := call.uncarried(plan.returned)):  # numbers not the plan's to give
            plan = self._untouched(replace(plan.report), f"{why}, after the call")
        self._state.settle(before)  # shows, as the trace's writes do
        why = plan.report.fallback  # a first run's writes of state (a cache it fills) may be done now; prints are not
        if ran and _CHANGES in why and ("sets " in why or "writes " in why):
            plan = self._compile(call, call.key + self._state.key() + _autocast())
        state = self._state.key()  # the trace showed which tensors it holds (their writes count not)
        plan.key = call.key + state + _autocast()
        plan = self._plans.setdefault(plan.key, plan)
        while len(self._plans) > MAX_PLANS:
            self._plans.popitem(last=False)
        self._state.pin()
        if layout is not None:
            plan.guard = plan.guard[0] if plan.guard[1] is _FAMILY else \
                _Exact(*call.tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None).check, state
            plan.again = self._fast(plan, layout)
        if ran:
            self._remember(plan)
            return _Ran(ran[0])
        return plan

    def _remember(self, plan: Plan) -> None:
        self._last, self._again = plan, plan.again

    def _fast(self, plan: Plan, layout: Layout) -> Callable[[tuple, dict], Any]:
        """For a call laid out as ``plan``'s first (no binding), the plan such a call found last where its C++ check
        finds the same tensors and state; else ``plan``, checked so; else its key's. A closure over what it checks."""
        check, laid, plans, keyed = plan.guard[0], layout.tensors, self._plans, self._state
        alone = (layout.arity, layout.keywords) if layout.order is None and not any(layout.slots) else None

        def again(args: tuple, kwargs: dict):
            try:  # a call of tensors alone, each where the first call had it, is its tensors
                tensors = (*args, *kwargs.values()) if (len(args), tuple(kwargs)) == alone else laid(args, kwargs)
                if tensors is None:
                    return _MISS
                now, found = keyed.current(), plan.next()
                if found is None or not found.guard[0](*tensors) or now != found.guard[1]:
                    found = plan if check(*tensors) and now == plan.guard[1] else \
                        plans.get(layout.key(tensors) + (now or keyed.key()) + _autocast())
                    if found is None:
                        return _MISS
                    plan.next = weakref.ref(found)  # its key's constants are this layout's
                    plans.move_to_end(found.key)
            except Exception:  # noqa: BLE001 - a global gone, a key None or unhashable, a flatten refused: slow path
                return _MISS
            self._remember(found)
            trees = layout.trees(args, kwargs) if found.returned and found.run else {}  # a fallback rebuilds none
            return self._ran(found, tensors, trees, args, kwargs)
        return again

    def _compile(self, call: BoundCall, key: tuple) -> Plan:
        """The plan made from its size family (effects: its samples', no ``Watch``), else traced under a ``Watch``."""
        signature = ", ".join(f"{n}: {str(t.dtype).removeprefix('torch.')}"
                              f"{'[nested]' if t.is_nested else list(t.shape)}"
                              for n, t in zip(call.names, call.tensors))
        report, made = Report(signature=f"{self._name}({signature})"), Sample((), None)
        try:
            plan = self._from_family(call, report, key)  # a refused call's family: its one plan, which runs the original
            if call.refused and (plan is None or plan.run is not None):
                plan = self._untouched(report, call.refused)
            elif plan is None and self._traced[shapes := _tensor_key(call.tensors)] >= RETRACES:
                plan = self._untouched(report, f"{RETRACES} plans were traced for tensors of these shapes, each for other "
                                       "constants (torch.compile's recompile limit): one changes every call")
            elif plan is None:
                self._traced[shapes] += 1
                with Watch(self.fn) as watch:
                    plan, changed = self._optimize(call, report, watch, made), watch.changes()
                if changed and plan.run is not None:
                    plan = self._untouched(plan.report, _changes(self._name, changed), plan.optimized)
        except InvariantError:  # a tripwire: a bug of ours that tests must see
            raise
        except Exception as e:  # noqa: BLE001 - never a wrong answer: the original runs instead
            plan = self._untouched(report, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        if not plan.report.sizes:  # traced here, not made from its family: a sample of it
            made.plan = plan
            self._families.record(key, made)
        return plan

    def _from_family(self, call: BoundCall, report: Report, key: tuple) -> Plan | None:
        """The plan of a size of a family (``families.py``) made from its two samples, validated; None where there is
        none or it fails validation (then it is optimized). Where a sample fell back, so does the size. It runs the
        family's one module, else one built for its size."""
        if (found := self._families.find(key)) is None:
            return None
        first, second, variable, n = found
        span = (first.sizes[variable.at[0]], second.sizes[variable.at[0]], n)
        like = next((s for s in (second, first) if s.plan.run is None), second)
        was = replace(like.plan.report, signature=report.signature, bounded=list(like.plan.report.bounded),
                      sizes=f"n = 2..{REACH * max(span[:2])}, n the size at {variable.where(call.names, call.tensors)}: "
                            f"made at n = {n} from the plans traced at n = {span[0]} and {span[1]}",
                      measured=None, validation=None)
        if like.plan.run is None:  # one plan, checked for the family's every size
            plan = self._untouched(was, f"so did its size family: {was.fallback}") if was.fallback \
                else Plan(None, was, None)
            plan.guard, second.serving = (variable.check(call.tensors, REACH * max(span[:2])), _FAMILY), plan
            return plan
        if first.returns != second.returns:
            return None
        try:  # a size not on the samples' lines fails to build or to run: it is optimized
            if second.shared is None:
                try:
                    second.shared = shared(first.module, second.module, span[:2])
                except (Apart, ValueError) as e:  # ValueError: graphs of different lengths
                    second.shared = str(e)
            if isinstance(second.shared, str):
                module = build_module(at(first.optimized, second.optimized, span), first.root,
                                      device=call.tensors[0].device.type, estimate=first.estimate)
                was.sizes += f"; built for this size, the samples' modules differ: {second.shared[:200]}"
            else:  # its sizes at the size of each call
                (family, holes), (i, d) = second.shared, variable.free(call.tensors)[0]
                sizes = functools.lru_cache(4096)(lambda n: [at(u, v, (*span[:2], n)) for u, v in holes])
                module = types.SimpleNamespace(kernels=first.module.kernels, writes=first.module.writes,
                                               forward=lambda *t: family.forward(*sizes(t[i].shape[d]), *t))
            run, was.kernels = runner(module, first.returns), module.kernels
            if self.validate:
                was.validation = self._validated(call, run, lambda: at(first.program, second.program, span),
                                                 first.program.written())
        except (Apart, RuntimeError, ValueError, IndexError):
            return None
        if was.validation and not was.validation.passed:
            return None
        plan = Plan(run, was, None, returned=tuple(call.returned), into=_into(call, module, first.returns),
                    writes=first.program.written())
        free, most = (0, 0) if isinstance(second.shared, str) else self._free(second, call, variable), REACH * max(span[:2])
        if check := variable.check(call.tensors, most, free):  # its bounds: the export's guards' (a window's n <= w)
            plan.guard, second.serving, was.sizes = (check, _FAMILY), plan, f"{was.sizes}; it serves them all, n = {max(2, free[0])}.." \
                f"{min(most, free[1])} (torch.export: one graph in n)"
        return plan

    def _free(self, sample: Sample, call: BoundCall, variable) -> tuple[int, int]:
        """The sizes torch.export finds the original one graph over with ``variable`` a symbol (once a family)."""
        if sample.free is None:
            with Watch(self.fn) as watch:  # what its run writes is put back: then none
                sample.free = free_sizes(call.traceable(self.fn), call.tensors, variable.free(call.tensors))
            sample.free = (0, 0) if watch.changes() else sample.free
        return sample.free

    def _validated(self, call: BoundCall, run: Callable, program: Callable[[], Program], writes: tuple = ()):
        """``run`` against the original on fresh inputs (``writes``: the arguments both write back); ``program()`` gives
        the long double reference past float64. Where the original itself refuses them (LLaVA counts the image tokens
        among its ids; a StaticCache its length), fresh floats beside the caller's own integers and booleans."""
        original, fresh = call.traceable(self.fn), random_inputs(call.tensors, call.names, self.input_ranges)
        try:
            return compare(original, run, fresh, lambda: wide_reference(program(), fresh), writes=writes)
        except Exception:  # noqa: BLE001 - the original's error, or the plan's (then raised as it is)
            try:
                with torch.no_grad():
                    original(*(a.clone() for a in fresh))
            except Exception:  # noqa: BLE001 - its own: inputs it does not take
                fresh = tuple(f if f.is_floating_point() or f.is_complex() else a for f, a in zip(fresh, call.tensors))
                return compare(original, run, fresh, lambda: wide_reference(program(), fresh), writes=writes)
            raise

    def _untouched(self, report: Report, why: str, found: Optimized | None = None) -> Plan:
        """The original runs; ``found``, the optimization it was preferred to, stays explorable."""
        report.fallback = why
        warnings.warn(f"egraph-opt: {report.signature} runs untouched: {why}", stacklevel=3)
        return Plan(None, report, found.egraph if found else None, found)

    def _optimize(self, call: BoundCall, report: Report, watch: Watch, made: Sample, functional=False, fastest=False):
        if hooks := around(self.fn):
            raise SideEffect(f"{', '.join(hooks)} run around the call: a plan of its forward would skip them")
        target, args = call.traceable(self.fn), call.tensors
        program, traced = capture(target, args, functional)
        writes = program.written()  # the arguments it writes back: validated, timed and guarded as such
        if watch.changes() and not watch.settles(lambda: target(*(a.clone() for a in args))):
            raise SideEffect(_changes(self._name, watch.changes()))  # a trace left it: no plan keeps it
        self._state.hold(traced)
        if not self.validate:  # else validation's run of the original shows it
            with torch.no_grad():
                _, written, original_s = run_counting_writes(target, args)
            if self._unseen_writes([i for i in written if i not in writes], call.names, functional):
                return self._optimize(call, report, watch, made, True, fastest)
        # torch.export's outputs stay flat leaves; fx's tracer keeps the type of a ModelOutput (fx makes it a dict)
        returns = getattr(traced, "_out_spec", None) or traced.meta.get("returns") or \
            tree_structure(returned(program.outputs))
        device = args[0].device.type if args else "cpu"
        latency, priced, model = self._cost_model(device, Objective.LATENCY if fastest else self.objective)
        result = optimize(program, rules=self.rules, model=model, limits=self.limits, input_ranges=self.input_ranges)
        flat = replace(result.program, outputs=tree_leaves(result.program.outputs))
        made.estimate = measured_estimate(latency)
        module = build_module(flat, traced, device=device, meta=result.program.meta(), estimate=made.estimate)
        run = runner(module, returns)
        made.program, made.optimized, made.root, made.returns, made.module = program, flat, traced, returns, module
        self._describe(report, program, result, module, latency, priced)
        if not self.keep_egraph:  # only the latest optimization's e-graph is kept (they are large)
            for older in self._plans.values():
                older.egraph = older.optimized = None
        if self.validate:
            report.validation = self._validated(call, run, lambda: program, writes)
            if self._unseen_writes(report.validation.written, call.names, functional):
                return self._optimize(call, report, watch, made, True, fastest)
            original_s = report.validation.original_s
            if report.validation.bounded:
                report.bounded.append(f"validation: {report.validation.bounded}")
            if not report.validation.passed:
                return self._untouched(report, f"validation failed: {report.validation.detail}", result)
        # the captured program on torch's or numpy's kernels: a rebuilt copy gains nothing, the original runs
        if unchanged(program, result.program) and not any(k.startswith("triton.") for k in module.kernels):
            report.kernels = {}  # it binds none
            return Plan(None, report, result.egraph, result)
        plan = Plan(run, report, result.egraph, result, returned=tuple(call.returned),
                    into=_into(call, module, returns), writes=writes)
        timed = call.as_called(self.fn, plan.into, plan.returned, writes) if plan.into else (target, plan.run)
        if writes:  # each timed run from the caller's values, on copies of them
            args, saved = tuple(a.clone() for a in args), [args[i].clone() for i in writes]
            timed = [lambda *a, f=f: [a[i].copy_(v) for i, v in zip(writes, saved)] and f(*a) for f in timed]
        kept = self._never_slower(plan, *timed, args, device, latency, original_s, fastest)  # as the caller calls
        return kept or self._optimize(call, report, watch, made, functional, fastest=True)

    def _cost_model(self, device: str, objective: Objective):
        """The latency database on ``device``, its pricing by the kernel that will run, and the cost model."""
        latency = None if self.profile_db is False else MeasuredLatency.from_database(
            self.profile_db, device, budget_s=self.profile_budget)
        priced = Pricing(latency, device) if latency else None
        return latency, priced, CostModel(objective, latency_of=priced, tolerance=self.tolerance,
                                          max_slowdown=self.max_slowdown)

    def _describe(self, report: Report, program, result: Optimized, module, latency, priced) -> None:
        """What the optimization did, its estimated error and latency, into ``report``."""
        seconds_before, _ = sources(program, priced)
        seconds_after, where_after = sources(result.program, priced)
        terms, shapes = postorder(program.roots()), program.meta()
        values = sum(math.prod(shapes[id(t)][0]) for t in terms)
        small = len(terms) <= ESTIMATED_UP_TO and values <= ESTIMATED_ELEMENTS
        errors = [program_error(p, self.input_ranges) for p in (program, result.program)] if small else []
        if not small:
            report.bounded.append(f"error estimate: not made: {len(terms)} terms (bound {ESTIMATED_UP_TO}) "
                                  f"holding {values:,} values (bound {ESTIMATED_ELEMENTS:,})")
        report.rewrites = [(r.name, r.describe(), n) for r, n in result.applied] + [("float64", "computed in float64 "
                           "from its float32 inputs, rounded once: no float32 form found is accurate", 1)] * result.widened
        report.derivation = result.derivation
        report.ranges = range_hints(result, self.input_ranges, self.rules, report.bounded)
        report.ops_before, report.ops_after = result.ops_before, result.ops_after
        report.cost_before, report.cost_after = result.cost_before, result.cost_after
        report.opaque = [c.describe() for c in program.opaque.values()]
        report.saturation = [f"{s.phase}: {s.iterations} iterations, {s.enodes} e-nodes, stopped: "
                             f"{s.stop}" for s in result.saturation]
        report.seconds, report.kernels = result.seconds, module.kernels
        report.latency = (seconds_before, seconds_after, where_after,
                          (latency.profiled, latency.spent_s, latency.busy) if latency else (0, 0.0, None))
        report.error = tuple(errors) if errors and all(errors) else None

    def _never_slower(self, plan: Plan, target, run, args, device: str, latency, original_s: float,
                      fastest: bool) -> Plan | None:
        """The plan, unless timed beside the original (``target``) it is slower and no steadier: then the original; or,
        where balanced extraction chose time for accuracy in a program too large to sample (None), the fastest form."""
        report, result = plan.report, plan.optimized
        left = self.profile_budget - (latency.spent_s if latency else 0.0)
        if left > 0 and 4 * original_s <= left:  # else its warm-up alone would overrun the budget
            timed = [_and_backward(f) for f in (target, run)] if torch.is_grad_enabled() else [target, run]
            report.measured = time_side_by_side(timed, args, device, left)
            report.backward = any(getattr(f, "leaves", None) for f in timed)  # where outputs needed a gradient
            if report.measured and slower_for_nothing(self.objective, result, *report.measured, report.error,
                                                      self.max_slowdown):
                before, after = report.measured
                beyond = self.objective is Objective.BALANCED and after > before * self.max_slowdown
                if self.objective is Objective.BALANCED and not (fastest or beyond or report.error) and \
                        for_accuracy(result):  # sampled, a program showed its error: the original is the safe one
                    report.bounded[:] = [f"balanced: its form for accuracy measured slower ({after * 1e6:.1f} us "
                                         f"against {before * 1e6:.1f} us) with no gain shown: the fastest form instead"]
                    return None
                return self._untouched(report, f"it measured slower ({after * 1e6:.1f} us against {before * 1e6:.1f} us) "
                                       + (f"by more than max_slowdown={self.max_slowdown:g}, the most accuracy may cost"
                                          if beyond else "and is no more stable"), result)
        if self.profile_budget > 0 and not report.measured:  # the never-slower check did not run
            report.bounded.append(f"timing: not timed side by side within the {max(left, 0):.2f} s left of "
                                  f"the profile budget (one call of the original took {original_s:.3f} s): "
                                  "the plan's speed is unchecked")
        return plan

    def _unseen_writes(self, written: tuple[int, ...], names: list[str], functional: bool) -> bool:
        """Whether to trace again in torch.export's functional form, which sees the arguments the original wrote where
        the trace did not (fx traces ``x += y`` as ``x + y``); refused where that form missed them too."""
        if written and functional:
            raise SideEffect(f"{self._name} mutates {', '.join(f'argument {names[i]!r}' for i in written)}")
        return bool(written)

    @property
    def report(self) -> Report | None:
        """The report of the plan that ran last (None before the first call)."""
        return self._last.report if self._last else None

    @property
    def egraph(self) -> EGraph | None:
        """The saturated e-graph of the plan that ran last (only the latest's is kept without ``keep_egraph``)."""
        return self._last.egraph if self._last else None

    @property
    def plans(self) -> dict[tuple, Plan]:
        return dict(self._plans)


def saturate_and_extract(fn: Callable | None = None, **options: Any):
    """Optimize ``fn`` (a function of tensors or an nn.Module) by equality saturation; bare or with options:
    ``objective`` ("balanced", "stability", "latency", or "tolerance" with ``tolerance=`` a relative error),
    ``input_ranges`` ({name: (lo, hi)}), ``rulesets`` (family or rule names), ``validate`` (default True), ``limits``,
    ``profile_db`` (a path; None: the default; False: static latencies), ``profile_budget`` (seconds per optimize to
    time kernels the database lacks: default 2, or $EGRAPH_OPT_PROFILE_BUDGET; 0: none), ``keep_egraph`` (every plan's),
    ``max_slowdown`` (balanced: the most time, as a multiple of the fastest program's, that a far more accurate one may
    take; default 4). A module comes back as an nn.Module (``OptimizedModule``), as torch.compile's does."""
    if fn is None:
        return lambda f: saturate_and_extract(f, **options)
    optimized = OptimizedFunction(fn, **options)
    return OptimizedModule(fn, optimized) if isinstance(fn, torch.nn.Module) else optimized


_OWN = ("_orig_mod", "forward")  # the wrapper's own attributes; every other one is the original's
_PLANS = ("report", "egraph", "plans")  # the OptimizedFunction's, as on a decorated function


class OptimizedModule(torch.nn.Module):
    """``saturate_and_extract(module)``: ``module`` run through its optimized plans, an nn.Module again, as
    torch.compile's ``OptimizedModule`` is, so code that trains, moves, saves or inspects a model keeps working:
    ``.report``, ``.egraph``, ``.plans`` as on a decorated function, the rest the original's. It shares the original's
    parameter, buffer and submodule tables: a checkpoint of either loads into the other."""

    def __init__(self, module: torch.nn.Module, optimized: OptimizedFunction):
        super().__init__()
        own = self.__dict__
        own["_orig_mod"], own["forward"] = module, optimized  # its plans
        for table in [k for k, v in own.items() if isinstance(v, dict)]:  # one table: one set of names, of hooks
            own[table] = module.__dict__[table]
        del own["training"]  # read through __getattr__: the original's flag is the one its code reads

    def __call__(self, *args, **kwargs):
        """The plans, around which no hook of the wrapper's runs: the original's run where it runs (eager's count)."""
        return self.__dict__["forward"](*args, **kwargs)

    def __getattr__(self, name: str):
        if name in _OWN or name == "fn":  # fn: the original, as on a decorated function (pictures run it beside a plan)
            return self.__dict__["_orig_mod" if name == "fn" else name]
        return getattr(self.__dict__["forward" if name in _PLANS else "_orig_mod"], name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def train(self, mode: bool = True) -> OptimizedModule:
        self._orig_mod.train(mode)  # its own override, if it has one, runs too
        return self

    def _apply(self, fn, recurse: bool = True) -> OptimizedModule:  # .to(), .cuda(), .half()...
        self._orig_mod._apply(fn, recurse)
        return self

    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def _load_from_state_dict(self, *args, **kwargs):  # a parent's load_state_dict reaches it so
        return self._orig_mod._load_from_state_dict(*args, **kwargs)

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"

    def __reduce__(self):  # a copy or pickle: its plans', the original decorated anew (a wrapper again)
        return self.forward.__reduce__()

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(dir(self._orig_mod)) | set(_PLANS))
