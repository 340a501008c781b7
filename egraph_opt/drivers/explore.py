"""``explore(obj)``: why the optimizer chose a program, what else it could have chosen, and how much better the choice
is, read from the saturated e-graph. Every method returns a ``Table``; costs are what the extractor compared."""
from __future__ import annotations

import functools
import html
import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..extractors import program_cost
from ..extractors.cost import LEAVES
from ..egraph.engine import ENode
from ..egraph.session import reopened
from ..extractors.enumerate import alternatives
from ..extractors.rounding_error import program_error
from ..lang import pattern as pat
from ..lang.program import Program
from ..kernels.torch_ops import TORCH
from ..lang.term import Term, evaluate, op_counts, postorder, pretty
from ..optimization import ematch
from ..optimization.derivation import term_classes
from ..optimization.pipeline import Optimized, class_shapes, enode_facts, optimize
from ..profiling.latency import UNIT_S
from ..rulesets import catalogue, select
from ..rulesets.guards import Fact, Guard, parse  # noqa: F401 - parse: the doctest
from .pictures import Table, clip

ESTIMATED_UP_TO = 256  #: programs of at most this many terms get a first-order error estimate (8 float64 runs each)
BATCH_EGRAPH_NODES = 150  #: a batch page draws a model's e-graph up to this many e-nodes, and summarizes a larger one
HINTS_UP_TO = 20_000  #: hints are looked for in e-graphs up to this many e-nodes (each guarded rule is matched anew)
#: the facts a declared range can prove: (relation or bound) of one e-class
_RELATION = {"positive": (0.0, True), "nonneg": (0.0, False)}
_BOUND = {"<=": ("hi", False), "<": ("hi", True), ">=": ("lo", False), ">": ("lo", True)}


class ExploreError(ValueError):
    """What was passed to ``explore`` has nothing to explore; the message says why, in one line."""


def explore(obj, *, input_ranges: dict | None = None) -> Explorer:
    """An Explorer of an optimized function (after a call), an ``optimize`` result, or an ONNX model path
    (optimized here); for a sharded plan (``egraph_opt.shard``), its alternative shardings' table."""
    from .sharded import ShardedPlan
    if isinstance(obj, ShardedPlan):
        return obj.alternatives()
    obj = obj.forward if hasattr(obj, "_orig_mod") else obj  # a decorated module: its OptimizedFunction
    if hasattr(obj, "_last") and hasattr(obj, "_plans"):  # an OptimizedFunction (the decorator
        return _of_function(obj)  # imports the explorer for its range hints: not the other way)
    if isinstance(obj, Optimized):
        return Explorer(obj, input_ranges or {})
    if isinstance(obj, str) and obj.endswith(".onnx"):
        from ..frontends.onnx_frontend import import_model, load
        program = import_model(load(obj), obj).program
        _refuse_opaque(program, obj)
        return Explorer(optimize(program), {}, name=obj)
    raise ExploreError(f"explore takes an optimized function, an optimize() result, a sharded plan "
                       f"or an .onnx path, not {type(obj).__name__}")


def model_pictures(result) -> dict[str, str]:
    """A batch model's pictures as markup, made where it was optimized: programs, and a small e-graph."""
    from .pictures import egraph_picture, picture, program_picture
    pictures = {"programs before and after": picture(program_picture(result.source.roots(), result.program.roots()))}
    try:
        pictures["the e-graph"] = picture(egraph_picture(explore(result), max_nodes=BATCH_EGRAPH_NODES))
    except ExploreError as e:
        pictures["the e-graph"] = f"<p>not drawn: {html.escape(str(e))}</p>"
    return pictures


def _of_function(fn) -> Explorer:
    name, plan = fn._name, fn._last
    if plan is None:
        raise ExploreError(f"{name} has never been called: call it once on example inputs, then explore it")
    if plan.optimized is None and plan.run is None and not plan.report.ops_before:
        raise ExploreError(f"{name} fell back to the original program before an e-graph was built, "
                           f"so there is nothing to explore: {plan.report.fallback}")
    if plan.optimized is None and plan.report.sizes:
        raise ExploreError(f"{name}'s last plan was made from its size family, not saturated "
                           f"({plan.report.sizes}): explore a call at one of those sizes")
    if plan.optimized is None:
        raise ExploreError(f"the e-graph of {name}'s last plan was dropped by a later optimization: "
                           "decorate with keep_egraph=True to explore every plan" +
                           (f" (that plan fell back: {plan.report.fallback})" if plan.run is None else ""))
    _refuse_opaque(plan.optimized.source, name)
    return Explorer(plan.optimized, fn.input_ranges, fn.rules, name, plan.report.fallback)


def _refuse_opaque(program: Program, name: str) -> None:
    if not op_counts(program.roots()):
        calls = ", ".join(c.describe() for c in program.opaque.values()) or "no op at all"
        raise ExploreError(f"{name} is entirely opaque to the Term language ({calls}): there is no e-graph to explore")


@dataclass
class PricedProgram:
    """One whole program: its cost as the extractor priced it, its estimated error, predicted
    latency, and a callable running it on torch tensors (the op table's torch implementations)."""
    rank: int
    term: Term  # the first root
    program: Program
    cost: int
    curvature: int
    latency_us: float
    error_bits: float | None  # worst first-order error over the input ranges (None: not estimable)

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        if self.program.opaque:
            raise ValueError("this program calls code the Term language does not hold: run the "
                             "optimized function itself")
        env = {t.attrs[0]: x for t, x in zip(self.program.inputs, tensors)}
        return evaluate([self.term], {**env, **self.program.params}, kernels=TORCH)[0]

    def __str__(self) -> str:
        return pretty(self.term)


class Explorer:
    """One optimization's saturated e-graph and costs; ``fallback``: why the found program does not run, or ""."""

    def __init__(self, result: Optimized, input_ranges: dict, rules=None, name: str = "program", fallback: str = ""):
        if result.source is None or result.cost is None:
            raise ExploreError("this optimize() result carries no e-graph to explore")
        self.result, self.ranges, self.name, self.fallback = result, dict(input_ranges), name, fallback
        self.rules, self.source = rules or select(), result.source
        session = reopened(result.egraph, self.source.roots())
        self.snap, self.loaded, self.root_classes = session.snap, session.class_of, session.root_classes
        self.meta, strides = class_shapes(self.snap, self.source.roots(), self.source.meta(), self.loaded,
                                          result.model.latency_of is not None)
        self.facts = enode_facts(self.snap, self.meta, strides)
        self._priced: dict[tuple, PricedProgram] = {}

    # --- what the extractor chose ---
    @functools.cached_property
    def chosen(self) -> dict:
        """The e-node the extracted program takes in each e-class it computes."""
        roots = self.result.program.roots()
        where = term_classes(self.snap, self.loaded, roots)
        nodes = {n for members in self.snap.classes.values() for n in members}
        return {where[id(t)]: node for t in postorder(roots)
                if (node := ENode(t.op, tuple(where[id(a)] for a in t.args), t.attrs)) in nodes}

    @functools.cached_property
    def _input_nodes(self) -> set:
        return {ENode(t.op, tuple(self.loaded[id(a)] for a in t.args), t.attrs) for t in postorder(self.source.roots())}

    def summary(self) -> Table:
        """The program found beside the input, priced alike; the title says whether it runs, or why not."""
        found, source = self.extracted, self._candidate(-1, self.source.roots()[0])
        runs = f"not taken: {self.fallback}; the original runs" if self.fallback else "the program found runs"
        return Table(f"{self.name}: {runs}", ["", "found", "input"], _side_by_side(found, source),
                     note=f"the e-graph: {len(self.snap.classes)} e-classes, {self.snap.num_enodes} e-nodes",
                     items=[found, source])

    def __repr__(self) -> str:
        return str(self.summary())

    def _repr_html_(self) -> str:
        return self.summary()._repr_html_()

    def widget(self):
        """egglog's interactive visualizer of the e-graph, for a live notebook with a browser."""
        return self.result.egraph.widget()

    def cost_of(self, cid: str, node) -> dict:
        """The extractor's price of one e-node, and its parts."""
        f, model = self.facts(cid, node), self.result.model
        found = model.latency_of(f) if model.latency_of and f.shapes is not None and f.op not in LEAVES else None
        source = "-" if not node.children else (found[1] if found else "static")
        return {"cost": model(f), "curvature": model.curvature(f), "latency_us": model.latency(f) * UNIT_S * 1e6,
                "source": source, "error": model.error(f) if node.children else 0.0}

    def _id(self, cid) -> str:
        cid = f"Tensor-{cid}" if isinstance(cid, int) else str(cid)
        if cid not in self.snap.classes:
            raise KeyError(f"no e-class {cid!r}; classes() lists them")
        return cid

    # --- the tables ---
    def classes(self, changed: bool = False) -> Table:
        """One row per e-class; ``changed``: only classes rewrites added to or created."""
        rows = []
        for cid in sorted(self.snap.classes, key=_number):
            nodes = self.snap.classes[cid]
            if changed and len(nodes) == 1 and cid in self.loaded.values():
                continue
            shape, dtype = self.meta.get(cid, ("?", "?"))
            (lo, hi), pick = self.snap.ranges.get(cid, (-float("inf"), float("inf"))), self.chosen.get(cid)
            rows.append([cid, ", ".join(n.op for n in nodes), list(shape) if shape != "?" else "?",
                         str(dtype).removeprefix("torch."), f"[{lo:.3g}, {hi:.3g}]", _node_text(pick) if pick else "-",
                         self.cost_of(cid, pick)["cost"] if pick else "-"])
        return Table(f"e-classes of {self.name}" + (" (changed by rewrites)" if changed else ""),
                     ["id", "members", "shape", "dtype", "range", "chosen", "cost"], rows, items=[r[0] for r in rows],
                     note=f"{len(rows)} of {len(self.snap.classes)} e-classes, {self.snap.num_enodes} e-nodes")

    def eclass(self, cid) -> Table:
        """The members of one e-class, each with its cost parts and the rule that produced it."""
        cid = self._id(cid)
        rows = [["*" if self.chosen.get(cid) == node else "", _node_text(node), c["cost"], c["curvature"],
                 f"{c['error']:.3g}", round(c["latency_us"], 2), c["source"], self.produced_by(cid, node)]
                for node in self.snap.classes[cid] for c in [self.cost_of(cid, node)]]
        return Table(f"e-class {cid} ({', '.join(n.op for n in self.snap.classes[cid])})", ["chosen", "member", "cost",
                     "curvature dB", "est. rel. error", "latency us", "latency from", "produced by"], rows,
                     note="* marks the member the extracted program takes", items=list(self.snap.classes[cid]))

    def produced_by(self, cid: str, node) -> str:
        """``input`` for an e-node of the input, else the first rule producing it (``ematch.producer``)."""
        if node in self._input_nodes:
            return "input"
        rule = ematch.producer(self.rules, self.snap.classes, cid, node)
        return rule.name if rule is not None else "analysis (no single rule)"

    def _candidate(self, rank: int, term: Term) -> PricedProgram:
        """Priced once per structure: the derivation, impact and why-not tables share them."""
        key = (rank, pretty(term))
        if key not in self._priced:
            program = self.source.with_roots({id(self.source.roots()[0]): term})
            roots = program.roots()
            parts = program_cost(roots, self.result.model, self.ranges, program.leaf_meta())
            error = program_error(program, self.ranges) if len(postorder(roots)) <= ESTIMATED_UP_TO else None
            self._priced[key] = PricedProgram(
                rank=rank, term=term, program=program, cost=parts["cost"], curvature=parts["curvature"],
                latency_us=parts["latency"] * UNIT_S * 1e6, error_bits=error.worst if error else None)
        return self._priced[key]

    @functools.cached_property
    def extracted(self) -> PricedProgram:
        return self._candidate(0, self.result.program.roots()[0])

    def alternatives(self, k: int = 5) -> Table:
        """The ``k`` cheapest programs of the first output, by DAG cost; ``table[i](*tensors)`` runs one."""
        found = [self._candidate(i + 1, a.term) for i, a in enumerate(
            alternatives(self.snap.classes, self.root_classes[0], self.result.cost, limit=k))]
        rows = [[c.rank, clip(str(c)), c.cost, c.curvature, round(c.latency_us, 2),
                 _bits(c.error_bits), "*" if str(c) == str(self.extracted) else ""] for c in found]
        return Table(f"the {len(found)} cheapest programs of {self.name}",
                     ["rank", "program", "cost", "curvature dB", "latency us", "error bits",
                      "extracted"], rows, note="call table[i](*tensors) to run one", items=found)

    def kernels(self) -> Table:
        """Every kernel binding weighs for each fused or computed node of the extracted program
        (Triton's where it runs): its latency with the moves into its backend, or why not."""
        if (paths_of := getattr(self.result.model.latency_of, "paths", None)) is None:
            raise ValueError(f"{self.name} was priced without a latency database (profile_db=False): "
                             "no kernel was weighed")
        rows, items = [], []
        for cid, node in sorted(self.chosen.items(), key=lambda item: _number(item[0])):
            f = self.facts(cid, node)
            if not node.children or f.op in LEAVES or f.shapes is None:
                continue
            for rank, path in enumerate(paths_of(f)):
                seconds = "-" if path.seconds == math.inf else round(path.seconds * 1e6, 2)
                rows.append([cid, f.op, path.kernel.name, seconds, path.refused or "",
                             "*" if rank == 0 and path.seconds < math.inf else ""])
                items.append(path)
        return Table(f"kernels weighed for the nodes of {self.name}",
                     ["e-class", "op", "kernel", "latency us", "why not", "bound"], rows,
                     note="* marks the kernel binding takes: the cheapest that runs the node", items=items)

    def why_not(self, x) -> Table:
        """``x`` a PricedProgram or a Term: its costs beside the extracted program's. ``x`` a rule
        name: why that rule is not in the result (pattern never matched, guard not proved...)."""
        if isinstance(x, str):
            return self._why_not_rule(x)
        other, mine = x if isinstance(x, PricedProgram) else self._candidate(-1, x), self.extracted
        held = term_classes(self.snap, self.loaded, [other.term])[id(other.term)] == self.root_classes[0]
        verdict = (f"the extracted program costs {other.cost - mine.cost} less" if other.cost > mine.cost
                   else "it costs the same: the extractor keeps the first of equals" if other.cost == mine.cost
                   else "it costs less: the extractor's DAG choice is greedy, not optimal")
        return Table(f"why not this program of {self.name}", ["", "extracted", "candidate"], _side_by_side(mine, other),
                     note=verdict + ("" if held else "; it is not in the e-graph: no rule derives it"))

    def _why_not_rule(self, name: str) -> Table:
        if (rule := catalogue().get(name)) is None:
            raise KeyError(f"no rule {name!r}; `egraph-opt rules` lists them")
        rows = [] if any(r.name == name for r in self.rules) else \
            [["ruleset", f"{name} was not among the rules of this run"]]
        lhs, found = rule.pairs()[0][0], self.failures(rule)
        if not found:
            present = any(n.op == lhs.op for nodes in self.snap.classes.values() for n in nodes)
            rows.append(["pattern", f"{pat.show(lhs)} matches nowhere in the e-graph" +
                         ("" if present else f" (no {lhs.op} node at all)")])
        for cid, bound, failed in [m for m in found if m[2]]:  # the matches whose guard failed
            free = self.undeclared(bound.values())
            rows.append(["guard", f"at e-class {cid}: " + "; ".join(why for _, why in failed) +
                         (f" (no declared range for {', '.join(free)}: pass input_ranges)" if free else "")])
        if fired := next((cid for cid, _, failed in found if not failed), None):
            pick = self.chosen.get(fired)
            rows.append(["fired", f"the pattern matches e-class {fired} with its guard holding; the "
                         f"extractor chose {_node_text(pick) if pick else 'no member of it'} "
                         "as cheaper (eclass() shows each member's cost)"])
        return Table(f"why not {name}: {rule.describe()}", ["part", "finding"], rows,
                     note=f"guard: {rule.when or 'none'}")

    def failures(self, rule) -> list[tuple[str, dict, list]]:
        """Each match of ``rule``'s left side: e-class, binding, and each failing guard fact with why."""
        guards = ematch.Guards(self.snap, self.meta)
        return [(cid, bound, [(fact, why) for fact in rule.when for ok, why in [guards.check(fact, bound)] if not ok])
                for cid, bound in ematch.matches(rule.pairs()[0][0], self.snap.classes)]

    def undeclared(self, classes) -> list[str]:
        """The inputs under ``classes`` (e-class ids among other values) with no declared range."""
        return sorted({n for c in classes if c in self.snap.classes
                       for n in ematch.inputs_under(self.snap.classes, c)} - set(self.ranges))

    def derivation(self) -> Table:
        """The steps from input to output, each a rule at a location, with error and latency before, after."""
        d = self.result.derivation
        rows = [[i + 1, s.name, s.location, clip(pretty(s.rewritten), 40), clip(pretty(s.result), 40)]
                for i, s in enumerate(d.steps)]
        if not d.start:  # repeated blocks were optimized as templates, each with its own steps
            return Table(f"derivation of {self.name} (per template, unpriced)",
                         ["step", "rule", "at", "rewrites", "into"], rows,
                         note="repeated blocks were optimized once each as templates: steps are within them")
        states = [self._candidate(0, roots[0]) for roots in d.states()]
        rows = [row + [_bits(a.error_bits), _bits(b.error_bits), round(a.latency_us, 2), round(b.latency_us, 2)]
                for row, a, b in zip(rows, states, states[1:])]
        note = "complete: the last step's program is the extracted one" if d.complete else \
            f"not derived further: {d.unexplained}"
        return Table(f"derivation of {self.name}", ["step", "rule", "at", "rewrites", "into", "error bits before",
                                                    "after", "latency us before", "after"], rows,
                     note=note, items=list(zip(d.steps, states, states[1:])))

    def impact(self) -> Table:
        """Per rule of the derivation: steps, and error (bits) and latency (us) each one gained."""
        gained: dict[str, tuple] = {}
        if not self.result.derivation.start:
            return Table(f"rewrite impact on {self.name}", ["rule"], [], note="not priced for templates")
        for step, a, b in self.derivation():
            n, e, t = gained.get(step.name, (0, 0.0, 0.0))
            gained[step.name] = (n + 1, e + ((a.error_bits or 0) - (b.error_bits or 0)),
                                 t + (a.latency_us - b.latency_us))
        rows = [[name, n, round(e, 2), round(t, 2)] for name, (n, e, t) in gained.items()]
        return Table(f"rewrite impact on {self.name}", ["rule", "steps", "error bits gained",
                                                        "latency us gained"], rows, items=rows)


def _number(cid: str) -> tuple:
    head, _, tail = cid.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (cid, 0)


def _node_text(node) -> str:
    parts = list(node.children) + [repr(a) if isinstance(a, str) else str(a) for a in node.attrs]
    return f"{node.op}({', '.join(parts)})"


def _side_by_side(a: PricedProgram, b: PricedProgram) -> list[list]:
    """Two programs' prices and texts, a row per measure: as the extractor compared them."""
    return [["cost", a.cost, b.cost], ["curvature dB", a.curvature, b.curvature],
            ["latency us", a.latency_us, b.latency_us], ["error bits", _bits(a.error_bits), _bits(b.error_bits)],
            ["program", clip(str(a)), clip(str(b))]]


def _bits(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def range_hints(result, input_ranges: dict, rules, bounded: list[str] | None = None) -> list[str]:
    """Where declaring input ranges lets a fix happen (undeclared, ``sqrt(x + 1) - sqrt(x)`` keeps its cancellation):
    per guarded rule failing only on undeclared inputs' ranges, where and what ranges; past ``HINTS_UP_TO``, a note."""
    if not {t.attrs[0] for t in result.source.inputs} - set(input_ranges):
        return []  # every input declared
    if (enodes := max((s.enodes for s in result.saturation), default=0)) > HINTS_UP_TO:
        if bounded is not None:
            bounded.append(f"range hints: not looked for: {enodes:,} e-nodes (bound {HINTS_UP_TO:,})")
        return []
    ex = Explorer(result, input_ranges, rules)
    terms = {ex.loaded[id(t)]: t for t in postorder(ex.source.roots())}
    @functools.cache
    def text(cid) -> str | None:  # when first asked for: all up front walked a deep program quadratically
        return pretty(terms[cid], width=60) if cid in terms else None
    hints = []
    for rule in [r for r in ex.rules if {"positive", "nonneg", "hi", "lo"} & r.when.heads()]:
        for cid, bound, failed in ex.failures(rule):
            needs = [_bounds(fact, bound, text) for fact, _ in failed]
            if not failed or None in needs:  # it fired here, or a range cannot prove what failed
                continue
            if free := ex.undeclared(map(bound.get, Guard(fact for fact, _ in failed).variables())):
                hints.append(f"{rule.name} matched {text(cid) or cid}; its guard needs {_intervals(needs)}, not "
                             f"proved: {', '.join(free)} {'has' if len(free) == 1 else 'have'} no declared range. Pass "
                             f"input_ranges={{{', '.join(f'{n!r}: (lo, hi)' for n in free)}}} within which these hold")
                break
    return hints


def _bounds(fact: Fact, bound: dict, text: Callable) -> dict | None:
    """``{value text: [lower, upper]}`` (each ``(number, strict)`` or None) that ``fact`` asks of
    a value; None where it is no such bound (a dtype, a rank, a constant's sign).
    >>> _bounds(parse("(<= (hi ?x) 10.0)"), {"x": "c"}, {"c": "x + 1"}.get)
    {'x + 1': [None, (10.0, False)]}
    """
    head, args = fact.head, fact.args
    if head in _RELATION and isinstance(args[0], pat.Var):
        var, need = args[0], [_RELATION[head], None]
    elif head in _BOUND and isinstance(args[0], Fact) and len(args[0].args) == 1 and isinstance(args[1], float) \
            and args[0].head == _BOUND[head][0] and isinstance(args[0].args[0], pat.Var):
        limit = (float(args[1]), _BOUND[head][1])
        var, need = args[0].args[0], [limit, None] if args[0].head == "lo" else [None, limit]
    else:
        return None
    return {text(bound[var.name]) or f"e-class {bound[var.name]}": need}


def _intervals(needs: list[dict]) -> str:
    """The bounds of each value joined into one interval: ``x in (0, 3.403e+38]``."""
    joined: dict[str, list] = {}
    for name, (lower, upper) in (item for need in needs for item in need.items()):
        have = joined.setdefault(name, [None, None])
        have[0] = max(filter(None, [have[0], lower]), default=None)
        have[1] = min(filter(None, [have[1], upper]), default=None, key=lambda b: (b[0], not b[1]))
    return ", ".join(f"{name} in {'[' if lo and not lo[1] else '('}{_end(lo, '-inf')}, "
                     f"{_end(hi, 'inf')}{']' if hi and not hi[1] else ')'}" for name, (lo, hi) in joined.items())


def _end(limit, none: str) -> str:
    return f"{limit[0]:.4g}" if limit else none
