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
    if len(roots) != 1 or len(root_classes) != 1 or program.opaque or len(postorder(best)) > MAX_NODES:
        return None
    terms = [best[0]] + [a.term for a in alternatives(snap.classes, root_classes[0], cost,
                                                      limit=ALTERNATIVES)] + [roots[0]]
    candidates, matched = [Candidate(t) for t in terms], []
    for rule in [*series, *(r for r in guarded if r.when.over_intervals)]:
        for binding in _matches(rule, snap, root_classes[0], cost):
            lhs, rhs = (pat.instantiate(p, binding) for p in (rule.lhs_pattern, rule.rhs_pattern))
            row = BY_NAME.get(rule.name)
            candidates.append(Candidate(rhs, rule, binding["x"], row.truncation) if row is not None
                              else Candidate(rhs, rule, guard=rule.when, binding=binding))
            matched.append((lhs, rhs))
    ids, seen, distinct = pat.structural_ids([c.term for c in candidates]), set(), []
    for c in candidates:  # a series' each; the others once per structure, if not too large
        if c.truncation is None and (ids[id(c.term)] in seen or len(postorder([c.term])) > MAX_NODES):
            continue
        seen.add(ids[id(c.term)] if c.truncation is None else None)
        distinct.append(c)
    found = infer_regimes(program.with_roots({id(roots[0]): distinct[0].term}), distinct,
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

