"""The sharding search: a program's e-graph saturated with the sharding rules for a mesh of n devices, and the
cheapest program in it under the mesh cost (``cost.py``), extracted globally, within the memory each device has."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..egraph.engine import ENode, Saturation
from ..egraph.session import Limits, Phase, saturate, terms_of
from ..extractors.enumerate import alternatives
from ..lang.program import Program
from ..lang.term import Term, postorder, shapes
from ..optimization.pipeline import class_meta
from ..profiling.latency import UNIT_S, MeasuredLatency
from ..rulesets import sharding as rules
from .cost import COLLECTIVES, MeshCost, memory

#: whole programs compared, from the DAG extractor's choice outward by increasing cost (its
#: relaxation settles each e-class once, so a cheaper program a few switches away can be missed)
SEARCH = 300


class ShardingError(ValueError):
    """A program or request the sharding stage cannot serve (named: what and why)."""


@dataclass
class Candidate:
    """One sharded program, priced: one device's predicted time (and its communication) and memory."""
    roots: list[Term]
    class_of: dict[int, str]
    units: dict[str, int]
    seconds: float
    comm_seconds: float
    memory: int

    def collectives(self) -> dict[str, int]:
        return dict(Counter(t.op for t in postorder(self.roots) if t.op in COLLECTIVES))


@dataclass
class Search:
    """The saturated e-graph of a program for a mesh, its cost, and what extraction chose."""
    program: Program
    n: int
    classes: dict
    root_class: str
    cost: MeshCost
    saturation: Saturation
    memory_limit: int | None
    best: Candidate
    original: Candidate

    def candidates(self, limit: int):
        """Sharded programs of the root e-class by increasing predicted time."""
        for alt in alternatives(self.classes, self.root_class, self.cost, limit=limit):
            yield _candidate(alt.choice, self.root_class, self.cost)


def search(program: Program, n: int, *, limits: Limits, latency: MeasuredLatency | None = None,
           links: dict | None = None, memory_limit: int | None = None) -> Search:
    if program.opaque:
        calls = ", ".join(c.describe() for c in program.opaque.values())
        raise ShardingError(f"cannot shard calls the Term language does not express: {calls}")
    if len(roots := program.roots()) != 1:
        raise ShardingError(f"sharding takes a program of one output tensor, this one has {len(roots)}")
    meta, phase = program.meta(), Phase(name="sharding", rules=tuple(rules.for_mesh(n)) if n > 1 else (), limits=limits)
    session = saturate(roots, [phase], meta=meta)
    snap, class_of, (root,) = session.snap, session.class_of, session.root_classes
    known = {class_of[i]: m for i, m in meta.items() if i in class_of}
    cost = MeshCost(n=n, meta=class_meta(snap.classes, known), classes=snap.classes, latency=latency, links=links)
    choice = {class_of[id(t)]: ENode(t.op, tuple(class_of[id(a)] for a in t.args), t.attrs) for t in postorder(roots)}
    original = _candidate(choice, root, cost)
    found = Search(program=program, n=n, classes=snap.classes, root_class=root, cost=cost,
                   saturation=session.saturation[0], memory_limit=memory_limit, best=original, original=original)
    fitting = [c for c in [original, *found.candidates(SEARCH)] if memory_limit is None or c.memory <= memory_limit]
    if not fitting:
        raise ShardingError(f"no sharding over {n} devices fits {memory_limit} bytes per device among "
                            f"the {SEARCH} fastest; unsharded it needs {original.memory}")
    found.best = min(fitting, key=lambda c: c.seconds)
    return found


def _candidate(choice: dict[str, ENode], root: str, cost: MeshCost) -> Candidate:
    """The program a choice of e-nodes spells, priced node by node (each e-class once)."""
    built = terms_of(choice, [root])
    units = {cid: cost(cid, choice[cid]) for cid in built}
    comm, term_meta = sum(u for cid, u in units.items() if choice[cid].op in COLLECTIVES), shapes([built[root]])
    return Candidate(roots=[built[root]], class_of={id(t): cid for cid, t in built.items()}, units=units,
                     seconds=sum(units.values()) * UNIT_S, comm_seconds=comm * UNIT_S,
                     memory=memory([built[root]], lambda t: term_meta[id(t)]))
