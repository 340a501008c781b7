"""DAG-aware greedy extraction over the e-graph (egglog's own is tree-costed and saturates on deep residual graphs).

Each e-class keeps its cheapest e-node with the cost of every e-class the choice depends on, so a shared
subterm is paid once; relaxation from the leaves up ends, costs being integers. Above ``EXACT_UP_TO`` e-nodes,
sharing is tracked only ``WINDOW`` levels down (deeper dependencies, a residual stream, are common to most
alternatives; tracking all is quadratic). A windowed choice found cyclic is extracted again exactly; where
relaxation itself closes a cycle, the choice is made in Knuth's order, acyclic by construction."""
from __future__ import annotations

import gc
import heapq
from collections import Counter, defaultdict, deque
from typing import Callable

from egraph_opt.egraph.engine import ENode
from egraph_opt.egraph.session import ExtractionError, terms_of
from egraph_opt.lang.term import Term

WINDOW, EXACT_UP_TO = 6, 20_000


def _users(classes: dict[str, list[ENode]]) -> tuple[list, dict[str, list[int]], list[int]]:
    """Every (class, e-node); the e-nodes (by index) using each class; their distinct operands."""
    nodes = [(cid, n) for cid in classes for n in classes[cid]]
    users: dict[str, list[int]] = defaultdict(list)
    for i, (_, n) in enumerate(nodes):
        for c in set(n.children):
            users[c].append(i)
    return nodes, users, [len(set(n.children)) for _, n in nodes]


def _knuth(classes: dict[str, list[ENode]], price: Callable, join: Callable) -> dict[str, tuple[int, ENode]]:
    """Each class's least value and its e-node, settled in Knuth's order (a class after every operand of its e-node:
    acyclic). An e-node's value: ``price(class, node, j)``, ``j`` its operands' folded by ``join`` from 0."""
    nodes, users, waiting = _users(classes)
    joined, heap = [0] * len(nodes), [(price(cid, n, 0), i) for i, (cid, n) in enumerate(nodes) if not n.children]
    heapq.heapify(heap)
    settled: dict[str, tuple[int, ENode]] = {}
    while heap:
        value, i = heapq.heappop(heap)
        cid, n = nodes[i]
        if cid in settled:
            continue
        settled[cid] = (value, n)
        for j in users[cid]:
            joined[j] = join(joined[j], value)
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (price(*nodes[j], joined[j]), j))
    return settled


def choose(classes: dict[str, list[ENode]], cost: Callable[[str, ENode], int],
           window: int | None = WINDOW) -> dict[str, ENode]:
    """The cheapest e-node of every e-class that has a finite program; ``cost(class, node)``.
    ``window`` bounds how many levels of sharing are tracked (None: all, exact but quadratic)."""
    # each class's least height: 0 for leaves, else one more than its e-node's tallest operand
    height = {cid: h for cid, (h, _) in _knuth(classes, lambda cid, n, tallest: tallest + 1 if n.children else 0,
                                               max).items()} if window is not None else {}
    nodes, users, _ = _users(classes)
    best: dict[str, tuple[int, dict[str, int], ENode]] = {}
    queue = deque(i for i, (_, n) in enumerate(nodes) if not n.children)
    queued = set(queue)
    while queue:
        i = queue.popleft()
        queued.discard(i)
        cid, n = nodes[i]
        if any(c not in best for c in n.children):
            continue
        parts = sorted((best[c][1] for c in set(n.children)), key=len, reverse=True)
        deps = dict(parts[0]) if parts else {}
        for p in parts[1:]:
            deps.update(p)
        if cid in deps:  # the choice would make this class depend on itself
            continue
        if window is not None:
            floor = height.get(cid, 0) - window
            deps = {c: v for c, v in deps.items() if height.get(c, 0) > floor}
        deps[cid] = cost(cid, n)
        total = sum(deps.values())
        if cid not in best or total < best[cid][0]:
            best[cid] = (total, deps, n)
            for j in users[cid]:
                if j not in queued:
                    queued.add(j)
                    queue.append(j)
    return {cid: entry[2] for cid, entry in best.items()}


def refine(choice: dict[str, ENode], roots: list[str], classes: dict[str, list[ENode]],
           cost: Callable[[str, ENode], int]) -> dict[str, ENode]:
    """Improve a greedy choice where sharing decides: switch a class to an alternative e-node whose operands the program
    computes anyway (attention weights also returned make the unfused matmul cheaper than a fused kernel)."""
    choice = dict(choice)
    refs: dict[str, int] = defaultdict(int, Counter(roots) + Counter(
        c for cid in _reachable(choice, roots) for c in choice[cid].children))
    for cid in _reachable(choice, roots):
        if len(classes[cid]) < 2 or refs[cid] == 0:  # no alternative, or no longer used
            continue
        for alt in classes[cid]:
            if alt == choice[cid] or any(c not in choice or refs[c] == 0 for c in alt.children):
                continue  # only alternatives over classes the program already computes
            if _switched([(cid, alt)], choice, refs, cost) < 0 and \
                    not any(cid in _reachable(choice, [c]) for c in alt.children):
                _switched([(cid, alt)], choice, refs, cost, apply=True)
    _share_new(choice, roots, classes, cost, refs)
    return choice


def _share_new(choice, roots, classes, cost, refs) -> None:
    """Switch several classes at once to alternatives over one class not computed yet, where paying for it
    once beats their costs apart: QKV projections sliced from one matmul lose alone and win together."""
    groups: dict[str, list[tuple[str, ENode]]] = defaultdict(list)
    for cid in _reachable(choice, roots):
        for alt in classes[cid] if len(classes[cid]) > 1 else ():
            new = [c for c in alt.children if refs[c] == 0]
            if alt != choice[cid] and len(set(new)) == 1 and all(c in choice for c in alt.children):
                groups[new[0]].append((cid, alt))
    for shared, members in groups.items():
        members = [(cid, alt) for cid, alt in members if refs[cid] > 0 and refs[shared] == 0]
        if not members or _switched(members, choice, refs, cost) >= 0:
            continue
        below = set(_reachable(choice, [shared]))
        if any(cid in below for cid, _ in members):
            continue  # the shared class depends on a class that would use it: a cycle
        _switched(members, choice, refs, cost, apply=True)


def _switched(members, choice: dict[str, ENode], refs: dict[str, int], cost, apply: bool = False) -> int:
    """Exact DAG cost change of switching each class of ``members`` to its alternative e-node, by the reference counts
    ``refs`` (a class is paid while its count is above 0); ``apply``: the switch is made, in ``choice`` and ``refs``."""
    delta, counts = 0, {}
    for cid, alt in members:
        delta += cost(cid, alt) - cost(cid, choice[cid])
        for step, start in ((1, alt.children), (-1, choice[cid].children)):
            stack = list(start)
            while stack:
                c = stack.pop()
                counts[c] = counts.get(c, refs[c]) + step
                if counts[c] == (1 if step > 0 else 0):  # a class starts or stops being paid
                    delta += step * cost(c, choice[c])
                    stack.extend(choice[c].children)
    if apply:
        refs.update(counts)
        choice.update(members)
    return delta


def _reachable(choice: dict[str, ENode], roots: list[str]) -> list[str]:
    order, stack = {}, list(roots)  # a dict: the classes in the order first reached
    while stack:
        if (cid := stack.pop()) not in order:
            order[cid] = None
            stack.extend(choice[cid].children)
    return list(order)


def extract(classes: dict[str, list[ENode]], roots: list[str], cost: Callable[[str, ENode], int]) -> list[Term]:
    """Best Term for each root e-class; the Terms share every common e-class."""
    collecting = gc.isenabled()
    gc.disable()  # extraction allocates millions of small objects and frees none of them
    try:
        for window in ([WINDOW, None] if sum(len(nodes) for nodes in classes.values()) > EXACT_UP_TO else [None]):
            choice = choose(classes, cost, window)
            if missing := [r for r in roots if r not in choice]:
                raise ExtractionError(f"e-class {missing[0]} has no finite program")
            try:
                built = terms_of(refine(choice, roots, classes, cost), roots)
                break
            except ExtractionError:  # a cycle: through classes deeper than the window, or through a
                continue             # choice made before a class it depends on improved
        else:
            built = terms_of(settled_in_order(classes, cost), roots)
        return [built[r] for r in roots]
    finally:
        if collecting:
            gc.enable()


def settled_in_order(classes: dict[str, list[ENode]], cost: Callable[[str, ENode], int]) -> dict[str, ENode]:
    """Each class's least-cost e-node (operands' costs summed) in Knuth's order: the fallback for cycles."""
    settled = _knuth(classes, lambda cid, n, operands: operands + cost(cid, n), lambda a, b: a + b)
    return {cid: n for cid, (_, n) in settled.items()}
