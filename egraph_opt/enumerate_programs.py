"""The alternative programs of an optimized program's outputs, priced as ``optimize`` priced its
extraction (../shared/DESIGN.md, principle 6): for profiling every path and for notebooks."""
from __future__ import annotations

from typing import Iterator

from .egraph import ENode, Snapshot
from .extractors import CostModel
from .extractors.enumerate import Alternative, alternatives
from .pipeline import Optimized, class_meta, enode_cost
from .term import Term, postorder, shapes


def alternatives_of(optimized: Optimized, root_index: int = 0, limit: int | None = 10,
                    model: CostModel | None = None) -> Iterator[Alternative]:
    """Programs of root ``root_index`` of ``optimized.program.roots()`` (outputs, then operands
    of opaque calls), cheapest first as ``extractors.enumerate`` guarantees. ``model`` must be the
    one ``optimize`` used; the default is its default, ``CostModel()``."""
    snap = optimized.egraph.snapshot()
    program = optimized.program
    roots = program.roots()
    found = classes_of(roots, snap)
    meta = shapes(roots, program.leaf_meta())
    known = {found[id(t)]: meta[id(t)] for t in postorder(roots)}
    cost = enode_cost(snap, model or CostModel(), class_meta(snap.classes, known))
    return alternatives(snap.classes, found[id(roots[root_index])], cost, limit=limit)


def classes_of(roots: list[Term], snap: Snapshot) -> dict[int, str]:
    """The e-class of every term of ``roots`` (by term id), found by structure: an optimized
    program is made of the e-graph's own e-nodes, so each term is one e-node over its operands'
    classes. (Anchors are no help: they are keyed by the ids of the terms first loaded.)"""
    where = {node: cid for cid, nodes in snap.classes.items() for node in nodes}
    found: dict[int, str] = {}
    for t in postorder(roots):
        node = ENode(t.op, tuple(found[id(a)] for a in t.args), t.attrs)
        if node not in where:
            raise KeyError(f"{t.op} term is not in the e-graph: was it optimized with this one?")
        found[id(t)] = where[node]
    return found
