"""Patterns matched against a saturated e-graph's snapshot, and rule guards evaluated there: to say which rule produced
an e-node, and why a rule never fired (its pattern matched nowhere, or its guard failed, and on what).
>>> from egraph_opt.egraph.engine import ENode
>>> classes = {"x": [ENode("input", (), ("x", "3", "float32"))], "e": [ENode("exp", ("x",), ())],
...            "l": [ENode("log", ("e",), ())]}
>>> list(ematch(pat.parse("(log (exp ?a))"), classes, "l"))
[{'a': 'x'}]
"""
from __future__ import annotations

import math
from typing import Iterator

from ..lang import pattern as pat
from ..lang.mesh import through_reshape
from ..lang.ops import parse_shape
from ..lang.term import topological
from ..rulesets.guards import Fact, Guard


def ematch(p, classes: dict, cid: str, bound: dict | None = None) -> Iterator[dict]:
    """Bindings of ``p`` at an e-node of ``cid``: tensor variables to e-class ids, attributes to values."""
    bound = bound or {}
    if isinstance(p, pat.Var):
        if p.name not in bound:
            yield {**bound, p.name: cid}
        elif bound[p.name] == cid:
            yield bound
        return
    for node in (n for n in classes.get(cid, ()) if n.op == p.op):
        attrs = bound  # extended by matching attribute patterns to the e-node's values, as on terms
        for q, v in zip(p.attrs, node.attrs):
            attrs = None if attrs is None else pat.match(q, v, {}, attrs)
        if attrs is not None:
            yield from _operands(list(zip(p.args, node.children)), classes, attrs)


def _operands(pairs: list, classes: dict, bound: dict) -> Iterator[dict]:
    if not pairs:
        yield bound
        return
    (q, child), rest = pairs[0], pairs[1:]
    for b in ematch(q, classes, child, bound):
        yield from _operands(rest, classes, b)


def matches(p, classes: dict) -> list[tuple[str, dict]]:
    """(e-class, binding) of every match of ``p`` anywhere in the e-graph."""
    return [(cid, b) for cid in classes for b in ematch(p, classes, cid)]


def producer(rules, classes: dict, cid: str, node):
    """The first rule with right side ``node`` (of ``cid``) and left side in that e-class, or None."""
    alone = {**classes, cid: [node]}
    for rule in rules:
        for lhs, rhs in rule.pairs():
            if not isinstance(rhs, pat.Node) or rhs.op != node.op:
                continue
            for b in ematch(rhs, alone, cid):
                if next(ematch(lhs, classes, cid, b), None) is not None:
                    return rule
    return None


class Guards:
    """Rule guards evaluated over the snapshot's analyses: intervals, sign relations, ``dtype-of``,
    ``last-dim``, ``rank``, ``axis-size`` and a reshape's ``reshape-axis``/``reshape-part``."""

    def __init__(self, snap, meta: dict):
        self.snap, self.meta = snap, meta

    def check(self, fact: Fact, bound: dict) -> tuple[bool, str]:
        """Whether ``fact`` holds under ``bound``, and a sentence saying what was (not) known."""
        try:
            if fact.value(bound, self._ask):
                return True, f"{fact} holds"
        except LookupError as e:
            return False, f"{fact}: {e.args[0]}"
        classes = [bound[v] for v in Guard((fact,)).variables() if bound.get(v) in self.snap.classes]
        shown = [f"e-class {c} has range [{lo:.4g}, {hi:.4g}]" for c in dict.fromkeys(classes)
                 for lo, hi in [self.snap.ranges.get(c, (-math.inf, math.inf))]]
        return False, f"{fact} is not proved" + (": " + "; ".join(shown) if shown else "")

    def _ask(self, head: str, cid: str, *rest):
        if head in self.snap.relations:
            return cid in self.snap.relations[head]
        if head in ("lo", "hi"):
            return self.snap.ranges.get(cid, (-math.inf, math.inf))[head == "hi"]
        if head == "dtype-of":
            return self.snap.dtypes.get(cid, "float32")
        if head not in ("last-dim", "rank", "axis-size", "reshape-axis", "reshape-part"):
            raise LookupError(f"no analysis of the snapshot answers {head}")
        if cid not in self.meta:
            raise LookupError(f"the shape of e-class {cid} is not known")
        shape = self.meta[cid][0]
        if head == "axis-size":
            if not -len(shape) <= rest[0] < 0:
                raise LookupError(f"e-class {cid} of shape {shape} has no axis {rest[0]:g}")
            return float(shape[int(rest[0])])
        if head in ("reshape-axis", "reshape-part"):
            if (kept := through_reshape(shape, parse_shape(rest[0])).get(int(rest[1]))) is None:
                raise LookupError(f"a reshape to {rest[0]} does not keep axis {rest[1]:g} whole")
            return float(kept[0]) if head == "reshape-axis" else kept[1]
        return float(len(shape) if head == "rank" else shape[-1])


def inputs_under(classes: dict, cid: str) -> set[str]:
    """Names of the inputs some e-node of ``cid`` reaches (the first e-node of every class)."""
    first = [classes[c][0] for c in topological([cid], lambda c: classes[c][0].children if c in classes else (), str)
             if c in classes]
    return {n.attrs[0] for n in first if n.op == "input"}
