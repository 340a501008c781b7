"""How the input program became the extracted one, Herbie-style: steps, each one rule at one location (a rule of
several roots: at each of its roots at once), replayed on Terms and checked against the saturated e-graph.

egglog 13.2 keeps no proofs, so the steps are found again: where the two programs differ, rules are applied forwards
to the input side and backwards to the output side until the two meet, and a step is kept only if the e-graph holds
its result in the e-class of what it rewrote and the rule's dtype guards hold. Every step is an equality the e-graph
proved, and the replay ends exactly at the extracted program or says where it stopped. The report's ``[REWRITE]``
lines are read from these steps: a rule shows there if and only if the output uses what it rewrote.
>>> from egraph_opt.optimization.pipeline import optimize
>>> from egraph_opt.lang.program import Program
>>> x = Term.input("x", (4,))
>>> naive = Term("sub", (Term("sqrt", (Term("add", (Term.const(1.0), x)),)), Term("sqrt", (x,))))
>>> result = optimize(Program((x,), naive), input_ranges={"x": (1.0, 1e6)})
>>> [step.name for step in result.derivation.steps]
['add-const-right', 'sqrt-difference', 'add-const-right (reversed)']
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..egraph.engine import ENode, Snapshot
from ..lang import pattern as pat
from .ematch import producer
from ..lang.term import Term, postorder, pretty, topological
from ..rulesets import Rule

BUDGET = 5_000  #: rewrites tried, and steps repeated where a shared subterm recurs, in all before the replay gives up
#: steps lifted one level up (a new root each, ``_lift``) that cost the budget as one rewrite tried
LIFTS_PER_REWRITE = 4
REACH = 6  #: how deep under a differing subterm a rewrite may apply (the deepest fusion pattern is ~6 ops)
DEPTH = 6  #: rewrites in a row from each side of one differing subterm before the two sides must meet


@dataclass(frozen=True)
class Step:
    """One rule at one location: ``path`` is the root's index then operand indices to the rewritten subterm;
    ``before``, ``after``: the whole root around it; ``together``: a rule's parts at its other roots."""
    rule: Rule
    path: tuple[int, ...]
    rewritten: Term
    result: Term
    before: Term
    after: Term
    reversed: bool = False  # the rule's right side rewritten into its left side
    together: tuple[Step, ...] = ()
    #: a part of a rule of several roots: (root of the rule, its bindings' structures)
    part: tuple = field(default=(), compare=False, repr=False)

    @property
    def location(self) -> str:
        return ", ".join(f"{_where(s.path)} of output {s.path[0]}" for s in (self, *self.together)) if self.together \
            else _where(self.path)

    @property
    def name(self) -> str:
        return self.rule.name + (" (reversed)" if self.reversed else "")

    def __str__(self) -> str:
        more = f" (and {len(self.together)} more roots)" if self.together else ""
        return (f"{self.name} at {self.location}: {pretty(self.rewritten, width=70)} -> "
                f"{pretty(self.result, width=70)}{more}")


@dataclass
class Derivation:
    steps: list[Step] = field(default_factory=list)
    complete: bool = True  # False: the replay stopped before reaching the output
    unexplained: str = ""  # where it stopped
    #: where the replay stopped: the rules whose right sides are the output's new e-nodes there
    unreplayed: list[Rule] = field(default_factory=list)
    start: list[Term] = field(default_factory=list)  # the input's roots
    end: list[Term] = field(default_factory=list)  # the extracted program's roots
    #: a piecewise output (``pipeline.piecewise``): each regime's label and its own derivation
    branches: list[tuple[str, Derivation]] = field(default_factory=list)

    def rules(self) -> list[Rule]:
        """Rules of the steps applied forwards, then those of the part not replayed, each once."""
        found = [s.rule for s in self.steps if not s.reversed] + self.unreplayed
        found += [r for _, b in self.branches for r in b.rules()]
        return list({r.name: r for r in found}.values())

    def states(self) -> list[list[Term]]:
        """The program's roots at the start and after each step: the last is ``end`` when complete."""
        current, states = list(self.start), [list(self.start)]
        for step in self.steps:
            for s in (step, *step.together):
                current[s.path[0]] = s.after
            states.append(list(current))
        return states

    def __str__(self) -> str:
        if self.branches:
            return "\n".join(f"regime {label}\n" + "\n".join("   " + line for line in str(b).splitlines())
                             for label, b in self.branches)
        lines = [f"{i + 1}. {s}" for i, s in enumerate(self.steps)] or ["(no rewrite: the output is the input)"]
        if not self.complete:
            lines.append(f"(not replayed step by step: {self.unexplained}; its new e-nodes come from "
                         f"{', '.join(r.name for r in self.unreplayed) or 'no single rule'})")
        return "\n".join(lines)


def _where(path: tuple) -> str:
    return "root" if len(path) == 1 else "/".join(map(str, path[1:]))


@dataclass(frozen=True)
class _Move:
    """One side of a rule into the other (``back``: right into left), with its dtype guards."""
    rule: Rule
    lhs: pat.Pattern
    rhs: pat.Pattern
    back: bool
    root: int | None  # which root of a rule of several roots
    dtypes: tuple


class _Replay:
    """Terms interned by structure, each in its snapshot e-class; rules as moves: forwards on input, back on output."""

    def __init__(self, snap: Snapshot, loaded: dict[int, str], rules: list[Rule]):
        self.node_class = {(n.op, n.children, n.attrs): cid for cid, nodes in snap.classes.items() for n in nodes}
        self.loaded, self.dtypes = loaded, snap.dtypes
        self.all_rules, moves = list(rules), []
        for r in rules:
            facts, several = tuple(r.when.dtypes()), len(r.pairs()) > 1
            for i, (lhs, rhs) in enumerate(r.pairs()):
                root = i if several else None
                moves.append(_Move(r, lhs, rhs, back=False, root=root, dtypes=facts))
                if isinstance(rhs, pat.Node) and set(pat.variables(lhs)) <= set(pat.variables(rhs)):
                    moves.append(_Move(r, rhs, lhs, back=True, root=root, dtypes=facts))  # an equality
        moves.sort(key=lambda m: m.back)  # a rule read backwards only where no forward one does
        self.moves: tuple[dict, dict] = ({}, {})  # forwards by the lhs's top op, backwards by the rhs's
        for m in moves:
            self.moves[0].setdefault(m.lhs.op, []).append(m)
            if isinstance(m.rhs, pat.Node):  # a bare variable would match every term
                self.moves[1].setdefault(m.rhs.op, []).append(m)
        self.keys: dict[int, int] = {}  # term id -> number of its structure
        self.numbers: dict[tuple, int] = {}  # (op, operand numbers, attrs) -> number
        self.classes: list[str | None] = []  # e-class by number
        self.alive: list[Term] = []  # interned terms stay alive so their ids stay theirs
        self.failed: set[tuple[int, int]] = set()  # (have, want) numbers the replay did not join
        self.solved: dict[tuple[int, int], tuple] = {}  # (have, want) numbers -> (steps, their path)
        self.budget = BUDGET

    def key(self, t: Term) -> int:
        if id(t) in self.keys:
            return self.keys[id(t)]
        for u in topological([t], lambda u: () if id(u) in self.keys else u.args, id):  # new terms only
            if id(u) not in self.keys:
                self.alive.append(u)
                k = (u.op, tuple(self.keys[id(a)] for a in u.args), u.attrs)
                if k not in self.numbers:
                    kids = tuple(self.classes[n] for n in k[1])
                    self.numbers[k] = len(self.classes)
                    self.classes.append(self.loaded.get(id(u)) or (
                        None if None in kids else self.node_class.get((u.op, kids, u.attrs))))
                self.keys[id(u)] = self.numbers[k]
        return self.keys[id(t)]

    def eclass(self, t: Term) -> str | None:
        return self.classes[self.key(t)]

    def solve(self, have: Term, want: Term, path: tuple) -> list[Step] | None:
        """Steps turning ``have`` into ``want`` (the subterms at ``path``), or None."""
        pair = (self.key(have), self.key(want))
        if pair[0] == pair[1]:
            return []
        if self.budget <= 0:
            return None
        if pair in self.solved:  # a subterm shared by several locations: its steps, moved here
            found, at = self.solved[pair]
            self.budget -= len(found)  # as many steps again (a DAG's tree of locations can be exponential)
            return [replace(s, path=path + s.path[len(at):]) for s in found]
        if pair in self.failed or self.eclass(have) != self.eclass(want):
            return None
        found = self._operands(have, want, path) if (have.op, have.attrs) == (want.op, want.attrs) else None
        found = self._search(have, want, path) if found is None else found
        if found is None:
            self.failed.add(pair)
        else:
            self.solved[pair] = found, path
        return found

    def _operands(self, have: Term, want: Term, path: tuple) -> list[Step] | None:
        steps: list[Step] = []
        for i, (a, b) in enumerate(zip(have.args, want.args)):
            if (sub := self.solve(a, b, path + (i,))) is None:
                return None
            self.budget -= len(sub) / LIFTS_PER_REWRITE  # each step rebuilt one level up
            steps += [_lift(s, have, i) for s in sub]
            have = _replace(have, (i,), b)
        return steps

    def _search(self, have: Term, want: Term, path: tuple) -> list[Step] | None:
        """Breadth first from both ends: ``have`` rewritten forwards, ``want`` backwards, each term one the e-graph
        holds in their e-class, until a term is on both sides, or two share their top op and their operands solve."""
        sides: tuple[dict, dict] = ({self.key(have): (have, [])}, {self.key(want): (want, [])})
        frontiers, depths = [[have], [want]], [0, 0]
        while open_ := [(len(f), s) for s, (d, f) in enumerate(zip(depths, frontiers)) if f and d < DEPTH]:
            side = min(open_)[1]  # the smaller frontier grows
            depths[side] += 1
            grown = []
            for term in frontiers[side]:
                steps = sides[side][self.key(term)][1]
                for where, move, old, new, part in self._rewrites(term, side):
                    after = _replace(term, where, new)
                    if (k := self.key(after)) in sides[side]:
                        continue
                    step = Step(move.rule, path + where, *((old, new, term, after) if side == 0 else
                                                           (new, old, after, term)), move.back, part=part)
                    sides[side][k] = after, (steps + [step] if side == 0 else [step] + steps)
                    grown.append(after)
                    if (found := self._meet(sides, side, k, path)) is not None:
                        return found
                if self.budget <= 0:
                    return None
            frontiers[side] = grown
        return None

    def _meet(self, sides: tuple[dict, dict], side: int, k: int, path: tuple) -> list[Step] | None:
        """Steps through the new term ``k`` of ``side`` to a term of the other side, if any."""
        term, steps = sides[side][k]
        pairs = [(k, k)] if k in sides[1 - side] else [
            (k, o) if side == 0 else (o, k) for o, (other, _) in sides[1 - side].items()
            if (other.op, other.attrs) == (term.op, term.attrs)]
        for f, b in pairs:
            (fterm, fsteps), (bterm, bsteps) = sides[0][f], sides[1][b]
            if (middle := [] if f == b else self._operands(fterm, bterm, path)) is not None:
                return fsteps + middle + bsteps
        return None

    def _rewrites(self, term: Term, side: int):
        """(location, move, subterm, rewritten, part) of every move whose result the e-graph holds in
        the subterm's e-class, at most REACH operands deep; side 1 rewrites right sides into left."""
        self.key(term)
        canon = self.keys  # structural numbers of every subterm (no walk of the term per search)
        frontier = [((), term)]
        for _ in range(REACH):
            below = []
            for where, sub in frontier:
                cid = self.eclass(sub)
                for move in self.moves[side].get(sub.op, ()) if cid is not None else ():
                    self.budget -= 1
                    bound = pat.match(move.rhs if side else move.lhs, sub, canon)
                    if bound is None or not all(self.dtypes.get(self.eclass(bound[v]), "float32") == dtype
                                                for v, dtype in move.dtypes if isinstance(bound.get(v), Term)):
                        continue  # unbound, or its rule's dtype guards fail on the e-graph's dtypes
                    try:
                        new = pat.instantiate(move.lhs if side else move.rhs, bound)
                    except (KeyError, ArithmeticError, ValueError):
                        continue
                    if isinstance(new, Term) and self.eclass(new) == cid:  # a part of a rule of several
                        # roots is joined with its other parts by the structures it binds
                        yield where, move, sub, new, () if move.root is None else (move.root, tuple(
                            sorted((v, self.key(t)) for v, t in bound.items() if isinstance(t, Term))))
                below += [(where + (i,), a) for i, a in enumerate(sub.args)]
            frontier = below


def _replace(term: Term, where: tuple, new: Term) -> Term:
    if not where:
        return new
    i = where[0]
    args = term.args[:i] + (_replace(term.args[i], where[1:], new),) + term.args[i + 1:]
    return Term.trusted(term.op, args, term.attrs)


def _lift(step: Step, parent: Term, i: int) -> Step:
    """A step found on operand ``i`` of ``parent``, seen on ``parent`` itself."""
    return replace(step, before=_replace(parent, (i,), step.before), after=_replace(parent, (i,), step.after))


def _joined(per_root: list[list[Step]]) -> list[Step]:
    """The roots' steps in one sequence, each root's in its order; the parts of one rule of several
    roots (the same bindings) become one step, taken once every root's earlier steps are."""
    queues, steps = [list(s) for s in per_root], []
    while any(queues):
        for q in queues:
            while q and not q[0].part:
                steps.append(q.pop(0))
        if heads := [q for q in queues if q]:
            first = heads[0][0]
            parts = [q.pop(0) for q in heads if (q[0].rule.name, q[0].reversed, q[0].part[1]) ==
                     (first.rule.name, first.reversed, first.part[1])]
            steps.append(replace(parts[0], together=tuple(parts[1:])))
    return steps


def derive(before: list[Term], after: list[Term], rules: list[Rule], snap: Snapshot,
           loaded: dict[int, str]) -> Derivation:
    """Steps from ``before`` to ``after`` over the saturated snapshot; ``loaded``: input terms' e-classes."""
    replay, derivation = _Replay(snap, loaded, rules), Derivation(start=list(before), end=list(after))
    per_root, unexplained = [], []
    for i, (b, a) in enumerate(zip(before, after)):
        if (steps := replay.solve(b, a, (i,))) is None:
            unexplained.append((i, a))
            continue
        per_root.append(steps)
    if unexplained:  # named up to 3 (a chain of roots, each printed, would print each one's past)
        derivation.complete, more = False, [f"{len(unexplained) - 3} more outputs"] if len(unexplained) > 3 else []
        derivation.unexplained = "; ".join([f"output {i}: {pretty(a, width=70)}" for i, a in unexplained[:3]] + more)
        # the rules that produced the e-nodes the input does not have (``ematch.producer``)
        node = lambda t: ENode(t.op, tuple(replay.eclass(a) for a in t.args), t.attrs)  # noqa: E731
        old = {node(t) for t in postorder(before)}
        found = [producer(replay.all_rules, snap.classes, replay.eclass(t), node(t))
                 for t in postorder([a for _, a in unexplained]) if t.args and node(t) not in old]
        derivation.unreplayed = [r for r in found if r is not None]
    derivation.steps = _joined(per_root)
    return derivation


def term_classes(snap: Snapshot, loaded: dict[int, str], roots: list[Term]) -> dict[int, str | None]:
    """The e-class of every term of ``roots`` (by id; None: not in the e-graph)."""
    replay = _Replay(snap, loaded, [])
    return {id(t): replay.eclass(t) for t in postorder(roots)}
