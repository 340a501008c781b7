"""Piecewise programs for the stability objective: the root e-class's cheapest programs and the
series rules that match it, handed to regime inference (``extractors/regimes.py``); and the
derivation of each regime's form, as the report shows it.

The exact candidates are e-class members, proven equal; a series candidate is its rule's right
side over a member its left side matches, close to it only where its truncation bound (counted)
says so; a guarded rule's candidate likewise, equal to it where its guard holds (proved over the
regime it is taken on).
"""
from __future__ import annotations

import math
from typing import Callable

from .derivation import Derivation, Step, derive
from .ematch import ematch
from ..egraph.engine import Snapshot
from ..extractors import extract
from ..extractors.enumerate import alternatives
from ..extractors.regimes import Candidate, Piecewise, infer_regimes
from ..lang import pattern as pat
from ..lang.program import Program
from ..lang.term import Term, postorder
from ..rulesets import Rule
from ..rulesets.series import BY_NAME

#: the cheapest programs of the root e-class tried as branches, and the largest tried
ALTERNATIVES, MAX_NODES = 8, 64


def piecewise(program: Program, roots: list[Term], best: list[Term], snap: Snapshot,
              root_classes: list[str], cost: Callable, input_ranges: dict | None,
              series: list[Rule], limit: float = math.inf, guarded: list[Rule] = ()
              ) -> tuple[Piecewise, list[tuple[Term, Term]]] | None:
    """The piecewise program regime inference finds over the best program, the root e-class's
    cheapest others, the input, the series that match (each within ``limit``, a relative
    truncation bound, on its regime) and the ``guarded`` rules that match but whose guard the
    declared ranges do not prove (each on a regime where it is proved); None where one program is
    as good. Also, per series or guarded candidate, (the member its rule matched, its form)."""
    if len(roots) != 1 or len(root_classes) != 1 or program.opaque:
        return None
    if len(postorder(best)) > MAX_NODES:
        return None
    terms = [best[0]] + [a.term for a in alternatives(snap.classes, root_classes[0], cost,
                                                      limit=ALTERNATIVES)] + [roots[0]]
    seen, candidates = set(), []
    for t in terms:
        key = _structure(t)
        if key not in seen and len(postorder([t])) <= MAX_NODES:
            seen.add(key)
            candidates.append(Candidate(t))
    matched = []
    for rule in series:
        for binding in _matches(rule, snap, root_classes[0], cost):
            lhs, rhs = (pat.instantiate(p, binding) for p in (rule.lhs_pattern, rule.rhs_pattern))
            row = BY_NAME[rule.name]
            candidates.append(Candidate(rhs, rule, binding["x"], row.truncation))
            matched.append((lhs, rhs))
    for rule in (r for r in guarded if r.when.over_intervals):
        for binding in _matches(rule, snap, root_classes[0], cost):
            lhs, rhs = (pat.instantiate(p, binding) for p in (rule.lhs_pattern, rule.rhs_pattern))
            if _structure(rhs) not in seen and len(postorder([rhs])) <= MAX_NODES:
                seen.add(_structure(rhs))
                candidates.append(Candidate(rhs, rule, guard=rule.when, binding=binding))
                matched.append((lhs, rhs))
    found = infer_regimes(program.with_roots({id(roots[0]): candidates[0].term}), candidates,
                          input_ranges, limit=limit)
    return None if found is None else (found, matched)


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


def _structure(t: Term) -> tuple:
    ids: dict[int, int] = {}
    for u in postorder([t]):
        ids[id(u)] = hash((u.op, tuple(ids[id(a)] for a in u.args), u.attrs))
    return ids[id(t)]


def derive_piecewise(found: Piecewise, matched: list[tuple[Term, Term]], roots: list[Term],
                     rules: list[Rule], snap: Snapshot, loaded: dict[int, str]) -> Derivation:
    """One derivation per regime (from the input to its form; a series' form by its rule's step
    from the member it matched), under a label that says the regime."""
    lhs_of = {id(rhs): lhs for lhs, rhs in matched}
    branches = []
    for label, regime in zip(found.describe(), found.regimes):
        term, series = regime.term, regime.candidate.rule  # a series or a guarded rule
        target = lhs_of[id(term)] if series is not None else term
        part = derive(roots, [target], rules, snap, loaded)
        if series is not None:
            part.steps.append(Step(series, (0,), target, term, target, term))
            part.end = [term]
        branches.append((label, part))
    return Derivation(start=list(roots), end=[found.term], branches=branches,
                      complete=all(b.complete for _, b in branches),
                      unexplained="; ".join(b.unexplained for _, b in branches if b.unexplained))

