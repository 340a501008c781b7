"""Every path, enumerable: the programs of an e-class one by one, cheapest first (DESIGN.md, principle 6).
Exact k-best under DAG costs is hard: this is a lazy best-first search from the extractor's choice, moving by
switches (one reached class takes another e-node; classes newly reached take the extractor's choice; a switch
to a cyclic or unfinished program is not taken). Candidates are queued once each by exact DAG cost, so the
search ends on cyclic e-graphs too (there can be exponentially many programs: pass ``limit``).

Order: each program yielded is the cheapest candidate so far. On an acyclic e-graph without sharing, that is the exact
k-best order; with sharing, a switch that frees a shared operand can cost less than its origin and is yielded at once
(the cost steps down). On a cyclic e-graph a program is missed only if every way to it passes a cyclic choice.
>>> from egraph_opt.egraph.engine import ENode
>>> from egraph_opt.lang.term import pretty
>>> classes = {"x": [ENode("input", (), ("x", "3", "float32"))], "2": [ENode("const", (), (2.0,))],
...            "r": [ENode("mul", ("x", "2"), ()), ENode("add", ("x", "x"), ())]}
>>> price = {"input": 0, "const": 0, "add": 2, "mul": 3}
>>> [(pretty(a.term), a.cost) for a in alternatives(classes, "r", lambda cid, n: price[n.op])]
[('x + x', 2), ('x * 2.0', 3)]
"""
from __future__ import annotations

import functools
import heapq
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterator

from egraph_opt.egraph.engine import ENode
from egraph_opt.egraph.session import ExtractionError, reached, terms_of
from egraph_opt.lang.term import Term

from .dag import choose, refine, settled_in_order

Cost = Callable[[str, ENode], int]


@dataclass(frozen=True)
class Alternative:
    """One program of the e-class: its Term (shared subterms shared, across alternatives too), DAG cost, that
    cost by op, and the e-node chosen in each e-class, operands first (to profile a path, or find it)."""
    term: Term
    cost: int
    parts: dict[str, int]  # largest first
    choice: dict[str, ENode]


def alternatives(classes: dict[str, list[ENode]], root: str, cost: Cost, *,
                 limit: int | None = None) -> Iterator[Alternative]:
    """Distinct programs of e-class ``root`` by increasing DAG cost, at most ``limit``; ``cost`` as for ``extract``."""
    price = functools.cache(cost)  # the search prices the same e-nodes for every candidate
    default = choose(classes, price)
    if root not in default:
        raise ExtractionError(f"e-class {root} has no finite program")
    default = refine(default, [root], classes, price)
    if (start := _program(root, {}, default)) is None:  # relaxation closed a cycle (see dag.py): Knuth's order cannot
        default = settled_in_order(classes, price)
        start = _program(root, {}, default)
    queue, seen = [(sum(price(c, n) for c, n in start.items()), 0, {})], {frozenset()}
    terms, yielded = {}, set()  # terms: one Term per structure, across alternatives
    while queue and (limit is None or len(yielded) < limit):
        total, _, overrides = heapq.heappop(queue)
        choice = _program(root, overrides, default)
        term = terms_of(choice, [root], terms)[root]
        if id(term) not in yielded:  # another choice can spell the same term: yield it once
            yielded.add(id(term))
            parts: Counter = Counter()  # where the cost of a path goes
            for cid, node in choice.items():
                parts[node.op] += price(cid, node)
            yield Alternative(term=term, cost=total, choice=choice,
                              parts=dict(sorted(parts.items(), key=lambda kv: (-kv[1], kv[0]))))
        for cid, chosen in choice.items():
            for node in (n for n in classes[cid] if n != chosen):
                trial = {**overrides, cid: node}
                if (switched := _program(root, trial, default)) is None:
                    continue
                kept = {c: n for c, n in trial.items() if c in switched and n != default[c]}
                if (key := frozenset(kept.items())) not in seen:
                    seen.add(key)
                    heapq.heappush(queue, (sum(price(c, n) for c, n in switched.items()), len(seen), kept))


def _program(root: str, overrides: dict[str, ENode], default: dict[str, ENode]) -> dict[str, ENode] | None:
    """The e-node of every class ``root`` reaches, operands first, taking ``overrides`` before
    ``default``; None when the choice is cyclic or reaches a class without a program."""
    try:
        return reached([root], lambda cid: overrides.get(cid) or default.get(cid))
    except ExtractionError:
        return None
