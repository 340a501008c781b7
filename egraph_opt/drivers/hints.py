"""Where declaring input ranges would let a fix happen: a guarded rule whose pattern matched, whose
guard failed only on range facts (``positive``, ``lo``/``hi`` bounds...) of values that depend on
an input with no declared range. Undeclared inputs range over every finite value (docs/DESIGN.md), so
without this line a fix silently does not happen (``sqrt(x + 1) - sqrt(x)`` keeps its cancellation).

>>> _bounds(parse("(<= (hi ?x) 10.0)"), {"x": "c"}, {"c": "x + 1"}.get)
{'x + 1': [None, (10.0, False)]}
"""
from __future__ import annotations

import functools
from typing import Callable

from ..lang.term import postorder, pretty
from ..lang.pattern import Var
from ..rulesets.guards import Fact, Guard, parse  # noqa: F401 - the doctest

#: the facts a declared range can prove: (relation or bound) of one e-class
_RELATION = {"positive": (0.0, True), "nonneg": (0.0, False)}
_BOUND = {"<=": ("hi", False), "<": ("hi", True), ">=": ("lo", False), ">": ("lo", True)}
#: hints are looked for in e-graphs up to this many e-nodes (each guarded rule is matched anew)
HINTS_UP_TO = 20_000


def range_hints(result, input_ranges: dict, rules, bounded: list[str] | None = None) -> list[str]:
    """One line per rule a declared range could let fire: the rule, where it matched, the range
    each value needs, and the inputs to declare. Where the e-graph is too large to look, a line
    saying so goes to ``bounded``."""
    from .explore import Explorer
    if not {t.attrs[0] for t in result.source.inputs} - set(input_ranges):
        return []  # every input declared
    enodes = max((s.enodes for s in result.saturation), default=0)
    if enodes > HINTS_UP_TO:
        if bounded is not None:
            bounded.append(f"range hints: not looked for: {enodes:,} e-nodes (bound {HINTS_UP_TO:,})")
        return []
    ex = Explorer(result, input_ranges, rules)
    terms = {ex.loaded[id(t)]: t for t in postorder(ex.source.roots())}

    @functools.cache
    def text(cid) -> str | None:  # when first asked for: all up front walked a deep program quadratically
        return pretty(terms[cid], width=60) if cid in terms else None
    hints = []
    for rule in ex.rules:
        if not {"positive", "nonneg", "hi", "lo"} & rule.when.heads():
            continue
        for cid, bound, failed in ex.failures(rule):
            needs = [_bounds(fact, bound, text) for fact, _ in failed]
            if not failed or None in needs:  # it fired here, or a range cannot prove what failed
                continue
            free = ex.undeclared(map(bound.get, Guard(fact for fact, _ in failed).variables()))
            if free:
                hints.append(f"{rule.name} matched {text(cid) or cid}; its guard needs "
                             f"{_intervals(needs)}, not proved: {', '.join(free)} "
                             f"{'has' if len(free) == 1 else 'have'} no declared range. Pass input_ranges="
                             f"{{{', '.join(f'{n!r}: (lo, hi)' for n in free)}}} within which these hold")
                break
    return hints


def _bounds(fact: Fact, bound: dict, text: Callable) -> dict | None:
    """``{value text: [lower, upper]}`` (each ``(number, strict)`` or None) that ``fact`` asks of
    a value; None where it is no such bound (a dtype, a rank, a constant's sign)."""
    head, args = fact.head, fact.args
    if head in _RELATION and isinstance(args[0], Var):
        return {_name(args[0], bound, text): [_RELATION[head], None]}
    if head in _BOUND and isinstance(args[0], Fact) and len(args[0].args) == 1 and isinstance(args[1], float):
        side, strict = _BOUND[head]
        if args[0].head == side and isinstance(args[0].args[0], Var):
            limit = (float(args[1]), strict)
            return {_name(args[0].args[0], bound, text): [limit, None] if side == "lo" else [None, limit]}
    return None


def _name(var: Var, bound: dict, text: Callable) -> str:
    return text(bound[var.name]) or f"e-class {bound[var.name]}"


def _intervals(needs: list[dict]) -> str:
    """The bounds of each value joined into one interval: ``x in (0, 3.403e+38]``."""
    joined: dict[str, list] = {}
    for need in needs:
        for name, (lower, upper) in need.items():
            have = joined.setdefault(name, [None, None])
            have[0] = max(filter(None, [have[0], lower]), default=None)
            have[1] = min(filter(None, [have[1], upper]), default=None, key=lambda b: (b[0], not b[1]))
    return ", ".join(f"{name} in {'[' if lo and not lo[1] else '('}{_end(lo, '-inf')}, "
                     f"{_end(hi, 'inf')}{']' if hi and not hi[1] else ')'}" for name, (lo, hi) in joined.items())


def _end(limit, none: str) -> str:
    return f"{limit[0]:.4g}" if limit else none
