"""The pipeline: the one place that knows Terms, rules, the e-graph and the extractor.

Program -> e-graph (roots: outputs and opaque operands) -> phases of rules under limits ->
DAG-aware extraction -> Program with the same interface."""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from . import templates as tmpl
from .derivation import Derivation, Step, derive, term_classes
from .ematch import ematch
from ..egraph.engine import EGraph, Saturation, Snapshot
from ..egraph.session import Limits, Phase, Session, fill, saturate
from ..extractors import CostModel, NodeFacts, Objective, extract, program_cost
from ..extractors.cost import ACCURATE_BY, LEXICOGRAPHIC
from ..extractors.curvature import rounding_free
from ..extractors.enumerate import alternatives
from ..extractors.regimes import MIN_GAIN, Candidate, Piecewise, infer_regimes
from ..extractors.rounding_error import elementwise, far_more_accurate, least_error, program_error, sampled_small
from ..lang import pattern as pat
from ..lang.ops import OPS
from ..lang.program import Program
from ..analysis.facts import Facts, class_constants
from ..analysis.layouts import result_strides, term_strides
from ..analysis.ranges import TOP, Interval, analyze, hull, transfer
from ..rulesets import Family, Rule, select
from ..rulesets.series import INVERSE, expand, to_sympy
from ..lang.term import Term, evaluate, infer, op_counts, postorder


@dataclass
class Optimized:
    program: Program
    egraph: EGraph
    saturation: list[Saturation]
    applied: list[tuple[Rule, int]]  # rules whose rewrite is in the extracted program, with matches
    cost_before: dict[str, int]
    cost_after: dict[str, int]
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    seconds: dict[str, float] = field(default_factory=dict)
    model: CostModel | None = None  # what priced the e-nodes
    cost: Callable | None = None  # cost(class id, e-node) as extraction used it
    root_classes: list[str] = field(default_factory=list)  # e-class of each root, in roots() order
    derivation: Derivation = field(default_factory=Derivation)  # the steps ``applied`` is read from
    source: Program | None = None  # the input program (its terms are the e-graph's anchors)
    widened: bool = False  # computed in float64 from its float32 inputs, rounded once (``_widest``); derivation: float32's


def optimize(program: Program, *, rules: list[Rule] | None = None, objective: Objective = Objective.BALANCED,
             limits: Limits = Limits(), schedule: list[Phase] | None = None, input_ranges: dict | None = None,
             model: CostModel | None = None, templates: bool = True, ranges: RangeMemo | None = None,
             widen: bool = True) -> Optimized:
    """Optimize a program: ``schedule``'s phases in order, else ``rules`` (default: all but unsafe) as one phase under
    ``limits``. ``input_ranges``: with the ops' facts, the only source for rule conditions; ``model`` prices nodes;
    ``templates``: repeated blocks once each; ``ranges``: an enclosing call's analysis; ``widen``: a whole program."""
    if schedule is None:
        schedule = [Phase("saturate", tuple(select() if rules is None else rules), limits)]
    model, ranges = model or CostModel(objective), ranges or RangeMemo(input_ranges)
    if templates and (groups := tmpl.find(shared := tmpl.shared(program))):
        return _optimize_templated(shared, groups, schedule, input_ranges, model, ranges)
    rules = [r for phase in schedule for r in phase.rules]
    roots, term_meta = program.roots(), program.meta()
    session, start = saturate(roots, schedule, ranges(roots, term_meta), term_meta), time.perf_counter()
    facts = enode_facts(session.snap, *class_shapes(session.snap, roots, term_meta, session.class_of,
                                                    model.latency_of is not None))
    cost = lambda cid, node: model(facts(cid, node))  # noqa: E731 - the extractor's price of an e-node
    best, regimes, reranked, accurate = _extract(program, session, cost, rules, input_ranges, model)
    widest = widen and _widest(program, best, input_ranges, model, accurate)
    best, widest = widest or (best, None)  # the float32 form widened: its derivation
    optimized, kept, before, after = _never_worse(program, widest or best, session.snap, session.class_of, model,
                                                  input_ranges, ranges, keep=reranked or bool(regimes or widest))
    seconds = {**session.seconds, "extract": time.perf_counter() - start}
    matches = sum((Counter(s.matches) for s in session.saturation), Counter())
    matched = list({r.name: r for r in rules if matches.get(r.name)}.values())
    derivation = derive_piecewise(regimes, roots, matched, session.snap, session.class_of) if regimes \
        else derive(roots, roots if optimized is program else best, matched, session.snap, session.class_of)
    # a series or a guarded rule matched once, as a regime (never in saturation)
    applied = [(r, matches[r.name] or 1) for r in derivation.rules()]
    return Optimized(program=optimized, egraph=session.egraph, saturation=session.saturation,
                     applied=applied, cost_before=before, cost_after=after, ops_before=op_counts(roots),
                     ops_after=op_counts(kept), model=model, seconds=seconds, cost=cost,
                     root_classes=session.root_classes, derivation=derivation, source=program, widened=bool(widest))


def _extract(program: Program, session: Session, cost: Callable, rules: list[Rule],
             input_ranges: dict | None, model: CostModel) -> tuple[list[Term], list | None, bool, list[Term] | None]:
    """(roots, regimes, re-ranked, most accurate re-ranked): the roots, re-ranked by error, or regimes' first."""
    roots, snap, root_classes = program.roots(), session.snap, session.root_classes
    best = extract(snap.classes, root_classes, cost)
    priced = lambda terms: program_cost(terms, model, input_ranges, program.leaf_meta())  # noqa: E731
    reranked, accurate = _rerank(program, roots, best, snap, root_classes, cost, input_ranges, model, priced) \
        if model.objective in (Objective.STABILITY, Objective.BALANCED) else (None, None)
    fastest, best = best, reranked or best
    # regimes (and series) under stability, under a tolerance the best single program breaks (its
    # series within it), under balanced where far more accurate (the mean of its sampled error, a
    # series' truncation counted) and, as re-ranking's, affordable: every branch runs (where selects)
    balanced = model.objective is Objective.BALANCED
    wants = model.objective is Objective.STABILITY or balanced or model.objective is Objective.TOLERANCE \
        and priced(best)["cost"] >= LEXICOGRAPHIC
    regimes = piecewise(program, roots, best, snap, root_classes, cost, input_ranges,
                        limit=math.inf if model.tolerance is None else model.tolerance,
                        guarded=[r for r in rules if r.when], gain=ACCURATE_BY if balanced else MIN_GAIN) \
        if wants else None
    if balanced and regimes and len(regimes.regimes) > 1 and \
            not model.affordable(*(priced(t)["latency"] for t in ([regimes.term], fastest))):
        regimes = None
    return ([regimes.term] if regimes else best), regimes, reranked is not None, accurate


def own_calls(program: Program, kept: list[Term], snap: Snapshot, class_of: dict) -> tuple:
    """The terms of ``kept`` that are a user's own call (``Program.own``): its op and attributes over operands in the
    e-classes of its operands, equal values wherever rewrites (an attention fused upstream) made them."""
    ids = pat.structural_ids([*program.roots(), *program.own]) if program.own else {}
    by_structure = {ids[i]: c for i, c in class_of.items() if i in ids}
    calls = {(t.op, t.attrs, classes) for t in program.own
             if None not in (classes := tuple(by_structure.get(ids[id(a)]) for a in t.args))}
    found = term_classes(snap, class_of, kept) if calls else {}
    return tuple(t for t in postorder(kept) if calls and (t.op, t.attrs, tuple(found[id(a)] for a in t.args)) in calls)


def _widest(program: Program, chosen: list[Term], input_ranges: dict | None, model: CostModel,
            accurate: list[Term] | None = None) -> tuple[list[Term], list[Term]] | None:
    """(a float32 form, it in float64 from its float32 inputs, rounded once), for a small elementwise program (Herbie's)
    where no float32 form is accurate: ``chosen`` under stability, no worse anywhere; under balanced ``chosen`` or the
    ``accurate`` form re-ranking saw (float64 keeps what float32 overflows, the form what float64 cancels: Henrywood and
    Agarwal's x + sqrt(x^2 - M^2) needs both), the more accurate that is far more so and affordable."""
    if model.objective not in (Objective.STABILITY, Objective.BALANCED) or len(chosen) != 1 or program.opaque or \
            program.params or not elementwise(chosen) or len(postorder(chosen)) > RERANK_NODES or \
            any(t.attrs[2] != "float32" for t in program.inputs):
        return None
    forms = [chosen] + ([accurate] if accurate is not None and accurate[0] is not chosen[0]
                        and model.objective is Objective.BALANCED else [])
    wide = [_in_float64(program, form) for form in forms]
    programs = [program.with_roots({id(program.roots()[0]): t[0]}) for t in [chosen, *wide]]
    if model.objective is Objective.BALANCED:
        latency = [program_cost(t, model, input_ranges, program.leaf_meta())["latency"] for t in [chosen, *wide]]
        found = far_more_accurate(programs, latency, model.affordable, input_ranges)
        return (forms[found - 1], wide[found - 1]) if found else None
    old, new = (program_error(p, input_ranges) for p in programs)
    return (chosen, wide[0]) if old and new and old.mean > 1 and new.worst <= old.worst and \
        new.mean <= old.mean - MIN_GAIN else None


def _in_float64(program: Program, chosen: list[Term]) -> list[Term]:
    """``chosen`` computed in float64 from its float32 inputs and rounded once to float32."""
    needs = {id(a) for t in postorder(chosen) for i, a in enumerate(t.args) if a.op == "input" and not (  # a cast: those
        OPS[t.op].shape_rule == "broadcast" and len(t.args) == 2 and t.args[1 - i].op != "const"  # no float64 operand
        and (i or t.args[1].op != "input"))}  # promotes, as torch does (a kernel fewer each)
    leaves = {id(t): (Term("cast", (t,), ("float64",)) if id(t) in needs else t) if t.op == "input" else  # constants
              Term.const(program.doubles.get(t.attrs[0], t.attrs[0])) for t in postorder(chosen) if t.op in ("input", "const")}
    return [Term("cast", tuple(tmpl.substitute(chosen, leaves)), ("float32",))]


def _never_worse(program: Program, best: list[Term], snap: Snapshot, class_of: dict, model: CostModel,
                 input_ranges: dict | None, ranges: RangeMemo, keep: bool) -> tuple[Program, list[Term], dict, dict]:
    """(program, roots, cost before, cost after), both priced with the ranges the e-graph proved (an e-class's, from
    every equivalent form, met with an extracted term's own), as the extractor saw them: greedy extraction is not
    optimal, so a costlier extraction gives the input back (unless ``keep``: chosen by error)."""
    roots, leaf_meta = program.roots(), program.leaf_meta()
    optimized = replace(program.with_roots({id(old): new for old, new in zip(roots, best)}),
                        own=own_calls(program, best, snap, class_of))
    own, proved = ranges(best, optimized.meta()), {i: snap.ranges.get(cid, TOP) for i, cid in class_of.items()}
    for i, cid in term_classes(snap, class_of, best).items():
        lo, hi = snap.ranges.get(cid, TOP) if cid else TOP
        lo, hi = max(lo, own[i][0]), min(hi, own[i][1])
        proved[i] = (lo, hi) if lo <= hi else own[i]
    before = program_cost(roots, model, input_ranges, leaf_meta, program.meta(), proved)
    after = program_cost(best, model, input_ranges, leaf_meta, optimized.meta(), proved)
    if after["cost"] > before["cost"] and not keep:  # (the estimate weighed the input program too)
        return program, roots, before, before
    return optimized, best, before, after


#: stability and balanced re-rank the RERANK cheapest programs of a root of at most RERANK_NODES terms and
#: RERANK_ELEMENTS numbers (each estimate runs in float64 with derivatives)
RERANK, RERANK_NODES, RERANK_ELEMENTS = 8, 64, 2 ** 14


def _rerank(program: Program, roots: list[Term], best: list[Term], snap: Snapshot, root_classes: list[str],
            cost: Callable, input_ranges: dict | None, model: CostModel,
            priced: Callable) -> tuple[list[Term] | None, list[Term] | None]:
    """Of the cheapest programs and the input, by first-order error sampled over the declared ranges (or the inputs' bit
    patterns), which sees what per-node costs cannot (a cancellation, an error a later op attenuates): under stability
    the least error, under balanced one far more accurate within ``max_slowdown`` (None: none chosen); and the least
    error's (float64 may make it affordable)."""
    if len(root_classes) != 1 or program.opaque or len(postorder(best)) > RERANK_NODES:
        return None, None
    # sampled errors tell programs apart where elementwise (Herbie's domain) or every input is
    # declared: drawn over all bit patterns, a matmul's operands overflow it almost everywhere
    if model.objective is Objective.BALANCED and not elementwise(roots) and \
            not all(t.attrs[0] in (input_ranges or {}) for t in program.inputs):
        return None, None
    if not sampled_small(program) and sum(math.prod(shape) for shape, _ in program.meta().values()) > RERANK_ELEMENTS:
        return None, None  # the input's values: an elementwise program is sampled small whatever its size
    found = [[a.term] for a in alternatives(snap.classes, root_classes[0], cost, limit=RERANK)]
    candidates = [best] + [c for c in found if len(postorder(c)) <= RERANK_NODES] + [roots]
    programs = [program.with_roots({id(roots[0]): c[0]}) for c in candidates]
    chosen = least_error(programs, input_ranges) if model.objective is Objective.STABILITY else far_more_accurate(
        programs, [priced(c)["latency"] for c in candidates], model.affordable, input_ranges)
    accurate = least_error(programs, input_ranges) if model.objective is Objective.BALANCED else chosen
    return (None if chosen is None else candidates[chosen]), (None if accurate is None else candidates[accurate])


def _optimize_templated(program: Program, groups: list, schedule: list[Phase],
                        input_ranges: dict | None, model: CostModel, ranges: RangeMemo) -> Optimized:
    """One optimization per template (over its instances' argument hull), one for the rest, then instances put in."""
    start = time.perf_counter()
    roots, leaf_meta, meta = program.roots(), program.leaf_meta(), program.meta()
    intervals = ranges(roots, meta)
    results, template_roots = [], []
    for group in groups:
        body, arg_leaves = tmpl.template_program(group[0], meta, program.params, program.own)
        hulls = {leaf.attrs[0]: hull(*[intervals[id(inst.args[i])] for inst in group])
                 for i, leaf in enumerate(arg_leaves)}
        # widened, one instance's value would differ from the same value computed in float32 elsewhere (an
        # exact cancellation of E[t^2] - E[t]^2 lost): only a whole program is widened
        result = optimize(body, schedule=schedule, input_ranges=hulls, model=model, templates=False, widen=False)
        for s in result.saturation:
            s.phase = f"{s.phase} [template of {group[0].scope} x{len(group)}]"
        results.append(result)
        template_roots.append(list(result.program.outputs))
    main = optimize(tmpl.outer_program(program, groups, meta), schedule=schedule, input_ranges=input_ranges,
                    model=model, templates=False, ranges=ranges)
    final = tmpl.resolve(main.program, groups, template_roots, [r.program.own for r in results])
    # each template computed in float32 rounds its output to the half dtype, and the next widens it again:
    # only a pass over the joined program drops those round trips and carries one float32 chain through
    precision = tuple(r for phase in schedule for r in phase.rules if r.family is Family.PRECISION)
    if precision and any(t.op == "cast" for t in postorder(final.roots())):
        joined = optimize(final, schedule=[Phase("join_precision", precision, schedule[-1].limits)],
                          input_ranges=input_ranges, model=model, templates=False, ranges=ranges)
        final = joined.program
        results.append(joined)
    best, before = final.roots(), program_cost(roots, model, input_ranges, leaf_meta, meta, intervals)
    after = program_cost(best, model, input_ranges, leaf_meta, final.meta(), ranges(best, final.meta()))
    if after["cost"] > before["cost"]:
        final, best, after = program, roots, before
    parts = results + [main]
    applied = sum((Counter({rule: n}) for r in parts for rule, n in r.applied), Counter())  # each rule's matches
    derivation = Derivation([s for r in parts for s in r.derivation.steps], all(r.derivation.complete for r in parts),
                            "; ".join(r.derivation.unexplained for r in parts if r.derivation.unexplained))
    return Optimized(program=final, egraph=main.egraph, saturation=[s for r in parts for s in r.saturation],
                     applied=list(applied.items()), cost_before=before, cost_after=after, ops_before=op_counts(roots),
                     ops_after=op_counts(best), model=model, seconds={"total": time.perf_counter() - start},
                     cost=main.cost, root_classes=main.root_classes, derivation=derivation, source=main.source,
                     widened=any(r.widened for r in parts))


class RangeMemo:
    """The range analysis of one optimize call: every distinct term structure met (input, outer, extracted and joined
    programs) gets its interval once, by one transfer step from its operands', and later programs reuse it. Sound: it
    depends only on the declared ranges (fixed per call), the shapes and the number of distinct operands (in the key:
    ``x * x`` is bounded tighter than ``x * y``)."""

    def __init__(self, declared: dict | None):
        self.declared = declared
        self._ids, self._intervals = {}, []  # structure -> its number; interval by number

    def __call__(self, roots: list[Term], meta: dict) -> dict[int, Interval]:
        """Interval of every term of ``roots`` by term id; ``meta``: their shapes and dtypes."""
        ids, out = {}, {}
        for t in postorder(roots):
            key = (t.op, tuple(ids[id(a)] for a in t.args), t.attrs, len({id(a) for a in t.args}), meta[id(t)])
            if key not in self._ids:
                self._ids[key] = len(self._intervals)
                self._intervals.append(transfer(t, [out[id(a)] for a in t.args], [meta[id(a)][0] for a in t.args])
                    if t.args or t.op == "const" else analyze([t], self.declared, None, meta)[id(t)])
            ids[id(t)] = self._ids[key]
            out[id(t)] = self._intervals[ids[id(t)]]
        return out


def class_meta(classes: dict, known: dict) -> dict:
    """(shape, dtype) of every e-class: by the first e-node ``infer`` takes, as for terms."""
    values = class_constants(classes)
    def meta_of(cid, node, operands):
        try:
            return infer(node.op, node.attrs, [values.get(c, m) for c, m in zip(node.children, operands)])
        except (RuntimeError, TypeError, ValueError, IndexError, KeyError):
            return None
    return fill(classes, known, meta_of)


def class_shapes(snap: Snapshot, roots: list[Term], term_meta: dict, class_of: dict,
                 layouts: bool) -> tuple[dict, dict | None]:
    """(shape, dtype) of every e-class, from the loaded terms' (``class_of``: term id -> class), and, where
    ``layouts`` (costs measured on the kernels' operands as they lie in memory), their strides."""
    meta = class_meta(snap.classes, {c: term_meta[i] for i, c in class_of.items()})
    if not layouts:
        return meta, None
    known, consts = term_strides(roots, term_meta), class_constants(snap.classes)
    def strides_of(cid, node, operands):
        return result_strides(node.op, node.attrs, [None if c in consts else meta[c] for c in node.children],
                              operands, meta[cid][0]) if cid in meta else None
    return meta, fill(snap.classes, {c: known[i] for i, c in class_of.items()}, strides_of)


def enode_facts(snap: Snapshot, meta: dict, strides: dict | None = None) -> Callable[[str, object], NodeFacts]:
    """``facts(class id, e-node)``: what the cost model knows of an e-node from the snapshot's analyses: its operand
    classes' intervals, dtypes, exactness, constness, shapes and layouts."""
    exact = closed_classes(snap.classes, lambda n: rounding_free(
        n.op, n.attrs, tuple(snap.dtypes.get(c, "float32") for c in n.children)))
    constant = closed_classes(snap.classes, lambda n: n.op in ("param", "const"), leaves_only=True)
    facts = Facts(meta, strides, class_constants(snap.classes), snap.ranges, snap.dtypes, exact, constant)
    return lambda cid, node: facts(node.op, node.attrs, node.children, cid)


def closed_classes(classes: dict, allowed: Callable, leaves_only: bool = False) -> set[str]:
    """E-classes some e-node of which is ``allowed`` over such classes (``leaves_only``: any op over
    them, from ``allowed`` leaves): exactly computed values, or values independent of the data."""
    return set(fill(classes, {}, lambda cid, n, _: True if (leaves_only and n.children) or allowed(n) else None))


# --- piecewise programs: the root e-class's cheapest programs, the guarded rules that match it and
# the root's own series, handed to regime inference (``extractors/regimes.py``); and the derivation
# of each regime's form, as the report shows it. A guarded rule's form equals the root where its
# guard holds (proved over its regime), a series is close to it where its bound (counted) says so.


def piecewise(program: Program, roots: list[Term], best: list[Term], snap: Snapshot,
              root_classes: list[str], cost: Callable, input_ranges: dict | None,
              limit: float = math.inf, guarded: list[Rule] = (), gain: float = MIN_GAIN) -> Piecewise | None:
    """The piecewise program regime inference finds over the best program, the root's cheapest others, the input, the
    ``guarded`` rules that match unproved (each on a regime where proved) and the root's series (each within ``limit``,
    a relative truncation bound); None where one program is as good by ``gain`` mean bits."""
    if len(roots) != 1 or len(root_classes) != 1 or program.opaque or len(postorder(best)) > RERANK_NODES or \
            any(t.op == "opaque" for t in postorder(roots)):  # a template's outputs: leaves no sample draws
        return None
    terms = [best[0]] + [a.term for a in alternatives(snap.classes, root_classes[0], cost, limit=RERANK)] + [roots[0]]
    candidates = [Candidate(t) for t in terms]
    for rule in [r for r in guarded if r.when.over_intervals]:
        for binding in _matches(rule, snap, root_classes[0], cost):
            lhs, rhs = (pat.instantiate(p, binding) for p in (rule.lhs_pattern, rule.rhs_pattern))
            candidates.append(Candidate(rhs, rule, guard=rule.when, binding=binding, lhs=lhs))
    ids, seen, distinct = pat.structural_ids([c.term for c in candidates]), set(), []
    for c in candidates:  # once per structure, if not too large
        if ids[id(c.term)] not in seen and len(postorder([c.term])) <= RERANK_NODES:
            seen.add(ids[id(c.term)])
            distinct.append(c)
    return infer_regimes(program.with_roots({id(roots[0]): distinct[0].term}), distinct, input_ranges,
                         limit=limit, gain=gain, more=lambda: _derived(roots[0], input_ranges))


def _derived(root: Term, ranges: dict | None) -> list[Candidate]:
    """The root's series around 0 and infinity in an input or a subterm it alone depends on (two at
    most), over the declared range; around infinity in an input where it matches at +-inf and NaN."""
    candidates = []
    for v in [t for t in postorder([root]) if t is not root and t.op != "const" and to_sympy(root, t)][:2]:
        lo, hi = (ranges or {}).get(v.attrs[0] if v.op == "input" else None, (-math.inf, math.inf))
        for at_infinity in (False, True)[:1 + (v.op == "input")]:
            found = expand(root, v, at_infinity, max(-lo, hi) if not at_infinity else
                           1 / min(abs(lo), abs(hi)) if lo * hi > 0 else math.inf)
            rhs = found and pat.instantiate(found.rule().rhs_pattern, {"x": v})
            ends = at_infinity and {v.attrs[0]: torch.tensor([math.inf, -math.inf, math.nan], dtype=torch.float64)}
            if found is None or ends and not torch.allclose(*(torch.as_tensor(y, dtype=torch.float64).expand(3)
                                                            for y in evaluate([root, rhs], ends, reference=True)),
                                                          equal_nan=True):
                continue  # none, or unlike the root at +-inf or NaN (a constant series is a number)
            within = pat.instantiate(pat.parse(INVERSE), {"x": v}) if at_infinity else v
            candidates.append(Candidate(rhs, found.rule(), within, found.truncation, lhs=root))
    return candidates


def _matches(rule: Rule, snap: Snapshot, root: str, cost: Callable, limit: int = 2):
    """Bindings (variables as Terms) under which the rule's left side matches the root e-class."""
    out = []
    for binding in ematch(rule.lhs_pattern, snap.classes, root):
        classes = [binding[v] for v in sorted(binding) if isinstance(binding[v], str)]
        try:
            terms = extract(snap.classes, classes, cost)
        except Exception:  # noqa: BLE001 - a class with no finite program: not a candidate
            continue
        out.append({**binding, **dict(zip(sorted(v for v in binding if isinstance(binding[v], str)), terms))})
        if len(out) >= limit:
            break
    return out


def derive_piecewise(found: Piecewise, roots: list[Term], rules: list[Rule], snap: Snapshot,
                     loaded: dict[int, str]) -> Derivation:
    """One derivation per regime, from the input to its form (a series' by its rule's step), labelled by regime."""
    branches = []
    for label, regime in zip(found.describe(), found.regimes):
        term, series = regime.candidate.term, regime.candidate.rule  # a series or a guarded rule
        target = regime.candidate.lhs if series is not None else term
        part = derive(roots, [target], rules, snap, loaded)
        if series is not None:
            part.steps.append(Step(series, (0,), target, term, target, term))
            part.end = [term]
        branches.append((label, part))
    return Derivation(start=list(roots), end=[found.term], branches=branches,
                      complete=all(b.complete for _, b in branches),
                      unexplained="; ".join(b.unexplained for _, b in branches if b.unexplained))

