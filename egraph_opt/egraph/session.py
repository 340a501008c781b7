"""One e-graph session, as the pipeline, enumeration and sharding all run it: terms loaded, a schedule of phases
saturated under limits, the e-graph snapshotted, a choice of e-nodes read back as terms; and one fix point over it."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from ..lang.term import Term, postorder
from .engine import EGraph, ENode, Saturation, Snapshot


@dataclass(frozen=True)
class Limits:
    """Bounds on one phase of saturation; the best program found so far is always extracted."""
    max_iterations: int = 30
    max_enodes: int = 50_000
    max_seconds: float = 10.0


@dataclass(frozen=True)
class Phase:
    """One named step of the schedule: its rules (``rulesets.Rule``) run to saturation or limits."""
    name: str
    rules: tuple
    limits: Limits = Limits()

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"phase name {self.name!r} must be an identifier")


class ExtractionError(RuntimeError):
    """No finite, acyclic program could be extracted for a root e-class."""


@dataclass
class Session:
    """A saturated e-graph of terms, snapshotted, with how each phase ran and how long it took."""
    egraph: EGraph
    snap: Snapshot
    saturation: list[Saturation]
    class_of: dict[int, str]  # of every loaded term, by term id
    root_classes: list[str]
    seconds: dict[str, float]


def saturate(roots: list[Term], schedule: list[Phase], intervals: dict | None = None,
             meta: dict | None = None) -> Session:
    """Load ``roots`` (with their intervals and (shape, dtype) by term id, where known), run the
    phases of ``schedule`` in order, each under its limits, and snapshot the e-graph."""
    start, egraph = time.perf_counter(), EGraph()
    egraph.add(roots, intervals, meta)
    built, saturation = time.perf_counter(), []
    for phase in schedule:
        egraph.add_rules(phase.name, phase.rules)
        saturation.append(egraph.saturate(phase.name, **vars(phase.limits)))  # its bounds by name
    return replace(reopened(egraph, roots), saturation=saturation,
                   seconds={"build": built - start, "saturate": time.perf_counter() - built})


def reached(roots: list[str], node_of: Callable[[str], ENode | None]) -> dict[str, ENode]:
    """The e-node ``node_of`` chooses in every e-class ``roots`` reach, operands first. Raises
    ExtractionError where the choice is cyclic or leaves a reached class without an e-node."""
    order, on_path = {}, set()
    stack: list[tuple[str, ENode | None]] = [(r, None) for r in reversed(roots)]
    while stack:
        cid, node = stack.pop()
        if node is not None:  # its operands are in order
            on_path.discard(cid)
            order[cid] = node
        elif cid not in order:
            if (node := node_of(cid)) is None or cid in on_path:
                raise ExtractionError(f"extracted choice is cyclic at e-class {cid}" if node else
                                      f"extracted choice has no e-node for e-class {cid}")
            on_path.add(cid)
            stack.append((cid, node))
            stack.extend((c, None) for c in node.children if c not in order)
    return order


def terms_of(choice: dict[str, ENode], roots: list[str], shared: dict | None = None) -> dict[str, Term]:
    """The Term of every e-class ``roots`` reach, spelled by its e-node in ``choice``: one Term per class,
    sharing what classes share (``shared``: across calls too). A cyclic choice raises ExtractionError."""
    built: dict[str, Term] = {}
    for cid, node in reached(roots, choice.get).items():
        args = tuple(built[c] for c in node.children)
        term = Term.trusted(node.op, args, node.attrs)
        built[cid] = term if shared is None else shared.setdefault((node.op, tuple(map(id, args)), node.attrs), term)
    return built


def fill(classes: dict[str, list[ENode]], known: dict, value_of: Callable) -> dict:
    """A value for every e-class it can give one: ``known`` classes keep theirs; any other, ``value_of(class,
    e-node, operand values)`` of its first e-node with valued operands (None: not from it), to a fix point."""
    out, changed = dict(known), True
    while changed:
        changed = False
        for cid, nodes in classes.items():
            found = None if cid in out else next(
                (v for n in nodes if all(c in out for c in n.children)
                 for v in [value_of(cid, n, [out[c] for c in n.children])] if v is not None), None)
            if found is not None:
                out[cid], changed = found, True
    return out


def reopened(egraph: EGraph, roots: list[Term]) -> Session:
    """The session of an e-graph ``roots`` were loaded into, as it stands: for a finished run's readers."""
    snap = egraph.snapshot()
    class_of = {id(t): snap.class_of_ref[egraph.ref(t)] for t in postorder(roots)}
    return Session(egraph=egraph, snap=snap, saturation=[], class_of=class_of,
                   root_classes=[class_of[id(r)] for r in roots], seconds={})
