"""Every path, enumerable: the programs of an e-class one by one, cheapest first
(../shared/DESIGN.md, principle 6), for profiling each alternative and for notebooks.

Exact k-best extraction under DAG costs is hard, so this is a lazy best-first search. A candidate
is a program: one e-node for each e-class it reaches. The search starts from the extractor's
choice (``choose`` then ``refine``) and moves by switches: one class the candidate reaches takes
another of its e-nodes, classes the switch newly reaches take the extractor's choice, and a switch
that would make the program cyclic, or reach a class without a finite program, is not taken.
Candidates wait in a priority queue by exact DAG cost (each e-class paid once) and are expanded
only when they come out; a candidate is queued at most once, so the search ends, cyclic e-graphs
included (the number of programs can be exponential: pass ``limit``). An expansion walks one
program per switch, O(program size x e-nodes of its classes). Everything is iterative: programs
can be thousands of nodes deep.

Order guaranteed: each program yielded is the cheapest of the candidates generated so far, with
its exact DAG cost. When no program of the root computes a class twice (DAG cost is tree cost)
and the e-graph is acyclic, this is the exact k-best order: the k-th program yielded is a k-th
cheapest. With sharing, a switch can free a shared operand and cost less than the program it
came from; such a program is yielded as soon as it is found, so the cost can step down there.
Every program is reached on an acyclic e-graph; on a cyclic one a program is missed only if every
sequence of switches towards it passes through a cyclic choice.

>>> from egraph_opt.egraph.engine import ENode
>>> from egraph_opt.lang.term import pretty
>>> classes = {"x": [ENode("input", (), ("x", "3", "float32"))], "2": [ENode("const", (), (2.0,))],
...            "r": [ENode("mul", ("x", "2"), ()), ENode("add", ("x", "x"), ())]}
>>> price = {"input": 0, "const": 0, "add": 2, "mul": 3}
>>> [(pretty(a.term), a.cost) for a in alternatives(classes, "r", lambda cid, n: price[n.op])]
[('x + x', 2), ('x * 2.0', 3)]
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Iterator

from egraph_opt.egraph.engine import ENode
from egraph_opt.lang.term import Term

from .dag import ExtractionError, choose, refine, settled_in_order

Cost = Callable[[str, ENode], int]


@dataclass(frozen=True)
class Alternative:
    """One program of the e-class: its Term (shared subterms are shared objects, also across
    alternatives), its DAG cost, that cost summed by op, and the e-node chosen in each e-class it
    computes, operands first (to profile a path or find it in the e-graph)."""
    term: Term
    cost: int
    parts: dict[str, int]
    choice: dict[str, ENode]


def alternatives(classes: dict[str, list[ENode]], root: str, cost: Cost, *,
                 limit: int | None = None) -> Iterator[Alternative]:
    """Distinct programs of e-class ``root``, by increasing DAG cost as the module docstring
    states, at most ``limit`` of them; ``cost(class, node)`` as for ``extract``."""
    price = _memo(cost)
    default = choose(classes, price)
    if root not in default:
        raise ExtractionError(f"e-class {root} has no finite program")
    default = refine(default, [root], classes, price)
    start = _program(root, {}, default)
    if start is None:  # relaxation closed a cycle (see dag.py): Knuth's order cannot
        default = settled_in_order(classes, price)
        start = _program(root, {}, default)
    if start is None:
        raise ExtractionError(f"extracted choice is cyclic at e-class {root}")
    queue = [(_total(start, price), 0, {})]
    seen = {frozenset()}
    terms: dict[tuple, Term] = {}  # one Term per structure, across alternatives
    yielded: set[int] = set()
    while queue and (limit is None or len(yielded) < limit):
        total, _, overrides = heapq.heappop(queue)
        choice = _program(root, overrides, default)
        term = _build(choice, terms)[root]
        if id(term) not in yielded:  # another choice can spell the same term: yield it once
            yielded.add(id(term))
            yield Alternative(term, total, cost_parts(choice, price), choice)
        for cid, chosen in choice.items():
            for node in classes[cid]:
                if node == chosen:
                    continue
                trial = {**overrides, cid: node}
                switched = _program(root, trial, default)
                if switched is None:
                    continue
                kept = {c: n for c, n in trial.items() if c in switched and n != default[c]}
                key = frozenset(kept.items())
                if key not in seen:
                    seen.add(key)
                    heapq.heappush(queue, (_total(switched, price), len(seen), kept))


def cost_parts(choice: dict[str, ENode], cost: Cost) -> dict[str, int]:
    """A program's DAG cost summed by op, largest first: where the cost of a path goes."""
    parts: dict[str, int] = {}
    for cid, node in choice.items():
        parts[node.op] = parts.get(node.op, 0) + cost(cid, node)
    return dict(sorted(parts.items(), key=lambda kv: (-kv[1], kv[0])))


def _program(root: str, overrides: dict[str, ENode], default: dict[str, ENode]
             ) -> dict[str, ENode] | None:
    """The e-node of every class ``root`` reaches, operands first, taking ``overrides`` before
    ``default``; None when the choice is cyclic or reaches a class without a program."""
    choice: dict[str, ENode] = {}
    on_path: set[str] = set()
    stack = [(root, False)]
    while stack:
        cid, done = stack.pop()
        if done:
            on_path.discard(cid)
            choice[cid] = overrides.get(cid) or default[cid]
            continue
        if cid in choice:
            continue
        if cid in on_path:  # reached again from inside its own operands
            return None
        node = overrides.get(cid) or default.get(cid)
        if node is None:
            return None
        on_path.add(cid)
        stack.append((cid, True))
        stack.extend((c, False) for c in node.children if c not in choice)
    return choice


def _build(choice: dict[str, ENode], terms: dict[tuple, Term]) -> dict[str, Term]:
    built: dict[str, Term] = {}
    for cid, node in choice.items():  # operands first
        args = tuple(built[c] for c in node.children)
        key = (node.op, tuple(id(a) for a in args), node.attrs)
        if key not in terms:
            terms[key] = Term(node.op, args, node.attrs)
        built[cid] = terms[key]
    return built


def _total(choice: dict[str, ENode], cost: Cost) -> int:
    return sum(cost(cid, node) for cid, node in choice.items())


def _memo(cost: Cost) -> Cost:
    """Each e-node is priced once: the search prices the same nodes for every candidate."""
    known: dict[tuple[str, ENode], int] = {}

    def price(cid: str, node: ENode) -> int:
        if (cid, node) not in known:
            known[(cid, node)] = cost(cid, node)
        return known[(cid, node)]
    return price
