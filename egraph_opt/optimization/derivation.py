"""How the input program became the extracted one, Herbie-style: a list of steps, each one rule
applied at one location, replayed on Terms and checked against the saturated e-graph.

egglog 13.2 keeps no proofs, so the steps are found again: where the two programs differ, rules
are applied to the input side (best first, towards the output's subterms) and a step is kept only
if the e-graph holds its result in the same e-class as what it rewrote. Every step is therefore an
equality the e-graph proved, and the replay ends exactly at the extracted program or says where it
stopped. The report's ``[REWRITE]`` lines are read from these steps, so a rule shows there if and
only if the output uses what it rewrote.

>>> from egraph_opt.optimization.pipeline import optimize
>>> from egraph_opt.lang.program import Program
>>> x = Term.input("x", (4,))
>>> naive = Term("sub", (Term("sqrt", (Term("add", (Term.const(1.0), x)),)), Term("sqrt", (x,))))
>>> result = optimize(Program((x,), naive), input_ranges={"x": (1.0, 1e6)})
>>> [step.name for step in result.derivation.steps]
['add-const-right', 'sqrt-difference', 'add-const-right (reversed)']
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from ..egraph.engine import ENode, Snapshot
from ..lang import pattern as pat
from .ematch import producer
from ..lang.term import Term, postorder, pretty
from ..rulesets import Rule

#: rewrites tried in all before the replay gives up (each a pattern match on a small subterm)
BUDGET = 5_000
#: how deep under a differing subterm a rewrite may apply (the deepest fusion pattern is ~6 ops)
REACH = 6
#: rewrites in a row at one differing subterm before its top must agree with the output's
DEPTH = 6


@dataclass(frozen=True)
class Step:
    """One rule at one location: ``path`` is the root's index then operand indices down to the
    rewritten subterm; ``before`` and ``after`` are the whole root before and after the step."""
    rule: Rule
    path: tuple[int, ...]
    rewritten: Term
    result: Term
    before: Term
    after: Term
    reversed: bool = False  # the rule's right side rewritten into its left side

    @property
    def location(self) -> str:
        return "root" if len(self.path) == 1 else "/".join(map(str, self.path[1:]))

    @property
    def name(self) -> str:
        return self.rule.name + (" (reversed)" if self.reversed else "")

    def __str__(self) -> str:
        return f"{self.name} at {self.location}: {_short(pretty(self.rewritten))} -> {_short(pretty(self.result))}"


@dataclass
class Derivation:
    steps: list[Step] = field(default_factory=list)
    complete: bool = True  # False: the replay stopped before reaching the output
    unexplained: str = ""  # where it stopped
    #: where the replay stopped: the rules whose right sides are the output's new e-nodes there
    unreplayed: list[Rule] = field(default_factory=list)
    start: list[Term] = field(default_factory=list)  # the input's roots
    end: list[Term] = field(default_factory=list)  # the extracted program's roots

    def rules(self) -> list[Rule]:
        """Rules of the steps applied forwards, then those of the part not replayed, each once."""
        found = [s.rule for s in self.steps if not s.reversed] + self.unreplayed
        return list({r.name: r for r in found}.values())

    def __str__(self) -> str:
        lines = [f"{i + 1}. {s}" for i, s in enumerate(self.steps)] or ["(no rewrite: the output is the input)"]
        if not self.complete:
            lines.append(f"(not replayed step by step: {self.unexplained}; its new e-nodes come from "
                         f"{', '.join(r.name for r in self.unreplayed) or 'no single rule'})")
        return "\n".join(lines)


def _short(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


class _Replay:
    """Terms interned by structure, each mapped to its e-class of the snapshot."""

    def __init__(self, snap: Snapshot, loaded: dict[int, str], rules: list[Rule]):
        self.node_class = {(n.op, n.children, n.attrs): cid for cid, nodes in snap.classes.items()
                           for n in nodes}
        self.loaded = loaded
        self.all_rules = list(rules)
        self.rules: dict[str, list] = {}  # (rule, from, to, reversed) by the op at the top of from
        for r in rules:
            if len(r.pairs()) != 1:  # a rule of several roots rewrites them together: not replayed
                continue
            lhs, rhs = r.pairs()[0]
            self.rules.setdefault(lhs.op, []).append((r, lhs, rhs, False))
            if isinstance(rhs, pat.Node) and set(pat.variables(lhs)) <= set(pat.variables(rhs)):
                self.rules.setdefault(rhs.op, []).append((r, rhs, lhs, True))  # an equality, read back
        self.keys: dict[int, int] = {}  # term id -> number of its structure
        self.numbers: dict[tuple, int] = {}  # (op, operand numbers, attrs) -> number
        self.classes: list[str | None] = []  # e-class by number
        self.alive: list[Term] = []  # interned terms stay alive so their ids stay theirs
        self.budget = BUDGET

    def key(self, t: Term) -> int:
        for u in postorder([t]):
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
        if self.key(have) == self.key(want):
            return []
        if (have.op, have.attrs) == (want.op, want.attrs):
            found = self._operands(have, want, path)
            if found is not None:
                return found
        return self._search(have, want, path)

    def _operands(self, have: Term, want: Term, path: tuple) -> list[Step] | None:
        steps: list[Step] = []
        for i, (a, b) in enumerate(zip(have.args, want.args)):
            sub = self.solve(a, b, path + (i,))
            if sub is None:
                return None
            steps += [_lift(s, have, i) for s in sub]
            have = _replace(have, (i,), b)
        return steps

    def _search(self, have: Term, want: Term, path: tuple) -> list[Step] | None:
        """Best first over rewrites of ``have`` that the e-graph holds, preferring terms that share
        more subterms with ``want``, until one has ``want``'s top op and its operands solve."""
        goal = {self.key(u) for u in postorder([want])}
        tie = itertools.count()
        queue = [(0, next(tie), have, [])]
        seen = {self.key(have)}
        while queue and self.budget > 0:
            _, _, term, steps = heapq.heappop(queue)
            if (term.op, term.attrs) == (want.op, want.attrs) and steps:
                rest = self._operands(term, want, path)
                if rest is not None:
                    return steps + rest
            if len(steps) >= DEPTH:
                continue
            for where, rule, back, old, new in self._rewrites(term):
                after = _replace(term, where, new)
                k = self.key(after)
                if k in seen:
                    continue
                seen.add(k)
                shared = sum(self.key(u) in goal for u in postorder([after]))
                step = Step(rule, path + where, old, new, term, after, back)
                cost = len(steps) + 1 + back  # a rule read backwards only where no forward one does
                heapq.heappush(queue, (cost - shared, next(tie), after, steps + [step]))
        return None

    def _rewrites(self, term: Term):
        """(location, rule, subterm, result) of every rule whose result the e-graph holds in the
        subterm's e-class, at most REACH operands deep."""
        canon = pat.structural_ids([term])
        frontier = [((), term)]
        for _ in range(REACH):
            below = []
            for where, sub in frontier:
                cid = self.eclass(sub)
                for rule, lhs, rhs, back in self.rules.get(sub.op, ()):
                    self.budget -= 1
                    bound = pat.match(lhs, sub, canon)
                    if bound is None or cid is None:
                        continue
                    try:
                        new = pat.instantiate(rhs, bound)
                    except (KeyError, ArithmeticError, ValueError):
                        continue
                    if isinstance(new, Term) and self.eclass(new) == cid:
                        yield where, rule, back, sub, new
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
    return Step(step.rule, step.path, step.rewritten, step.result,
                _replace(parent, (i,), step.before), _replace(parent, (i,), step.after), step.reversed)


def derive(before: list[Term], after: list[Term], rules: list[Rule], snap: Snapshot,
           loaded: dict[int, str]) -> Derivation:
    """The steps from ``before`` to ``after`` (roots in the same order), over the snapshot of the
    saturated e-graph; ``loaded`` maps each input term's id to its e-class."""
    replay = _Replay(snap, loaded, rules)
    derivation = Derivation(start=list(before), end=list(after))
    for i, (b, a) in enumerate(zip(before, after)):
        steps = replay.solve(b, a, (i,))
        if steps is None:
            derivation.complete = False
            derivation.unexplained += f"{'; ' if derivation.unexplained else ''}output {i}: {_short(pretty(a))}"
            derivation.unreplayed += _producers(replay, snap, before, a)
            continue
        derivation.steps += steps
    return derivation


def _producers(replay: _Replay, snap: Snapshot, before: list[Term], after: Term) -> list[Rule]:
    """Rules that produced the e-nodes of ``after`` the input does not have (``ematch.producer``)."""

    def node(t: Term) -> ENode:
        return ENode(t.op, tuple(replay.eclass(a) for a in t.args), t.attrs)
    old = {node(t) for t in postorder(before)}
    found = [producer(replay.all_rules, snap.classes, replay.eclass(t), node(t))
             for t in postorder([after]) if t.args and node(t) not in old]
    return [r for r in found if r is not None]


def term_classes(snap: Snapshot, loaded: dict[int, str], roots: list[Term]) -> dict[int, str | None]:
    """The e-class of every term of ``roots`` (by id; None: not in the e-graph)."""
    replay = _Replay(snap, loaded, [])
    return {id(t): replay.eclass(t) for t in postorder(roots)}
