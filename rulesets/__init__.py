"""The rule catalogue: every rewrite is one named declaration of a family module.

A rule is data (name, lhs, rhs, family, exactness, condition, why). Tags are closed enums, so a typo fails at import
instead of silently dropping a rule. egglog rewrites carry our names (``:name``), so run reports say which rule matched.
A stability rule's purpose is checked in the tests: at an extreme, offset or nearly-equal input in float32 its right
side is accurate where its left side overflows, underflows or cancels."""
from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass

from egraph_opt.lang import pattern as pat

from .guards import Guard, when


class Family(enum.Enum):
    STABILITY = "stability"
    FUSION = "fusion"
    ALGEBRA = "algebra"
    DECOMPOSITION = "decomposition"
    PRECISION = "precision"
    SERIES = "series"  # derived per program (series.py), taken on a regime: none in the catalogue
    SHARDING = "sharding"  # a stage of its own (egraph_opt/sharding/): only when asked for


class Exactness(enum.Enum):
    EXACT = "exact"          # an identity over the reals
    REASSOC = "reassoc"      # exact over the reals, rounds differently in floating point
    APPROX = "approx"        # close, not equal (tolerance-bounded)
    UNSAFE = "unsafe"        # wrong for some inputs: quarantined, never run by default


class RuleError(ValueError):
    """A rule declaration that breaks the catalogue's invariants."""


_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


@dataclass(frozen=True)
class Rule:
    name: str
    lhs: str
    rhs: str
    family: Family
    exactness: Exactness = Exactness.EXACT
    when: Guard = Guard()  # facts that must hold, over lhs variables (text or facts: parsed here)
    why: str = ""
    sample: tuple = ()  # (variable, value) pairs the proof sampler must use: shapes, strides
    counterexample: tuple = ()  # (variable, value) pairs where an UNSAFE rule is wrong
    more: tuple[tuple[str, str], ...] = ()  # further (lhs, rhs) roots rewritten together
    binds: tuple[str, ...] = ()  # variables the ``when`` facts bind: i64 (sizes of ``__lhs2``...),
    # or ``name:Sort`` (a reshape's shape for a device's part: ``t:String``)

    def __post_init__(self):
        if not _NAME.fullmatch(self.name):
            raise RuleError(f"rule name {self.name!r} is not kebab-case")
        pairs = self.pairs()
        if not all(isinstance(lhs, pat.Node) for lhs, _ in pairs):
            raise RuleError(f"{self.name}: left side must be an op, not {self.lhs!r}")
        lhs_vars = {v: s for lhs, _ in pairs for v, s in pat.variables(lhs).items()} | self.bound()
        rhs_vars = {v: s for _, rhs in pairs for v, s in pat.variables(rhs).items()}
        try:
            object.__setattr__(self, "when", when(*self.when))
            self.when.check(set(lhs_vars))
        except ValueError as e:  # a fact that is none, or asks what no analysis answers
            raise RuleError(f"{self.name}: guard {e}") from None
        if missing := set(rhs_vars) - set(lhs_vars):
            raise RuleError(f"{self.name}: right side uses unbound {sorted(missing)}")
        for v, sort in rhs_vars.items():
            if lhs_vars[v] != sort:
                raise RuleError(f"{self.name}: ?{v} is {lhs_vars[v]} on the left, {sort} on the right")

    def bound(self) -> dict[str, str]:
        """The sort of each variable the guards bind."""
        return dict((b.split(":") + ["i64"])[:2] for b in self.binds)

    def pairs(self) -> list[tuple[pat.Pattern, pat.Pattern]]:
        """Every (left, right) root of the rule: one, or several rewritten together."""
        return [(pat.parse(lhs), pat.parse(rhs)) for lhs, rhs in ((self.lhs, self.rhs), *self.more)]

    @property
    def lhs_pattern(self) -> pat.Pattern:
        return pat.parse(self.lhs)

    @property
    def rhs_pattern(self) -> pat.Pattern:
        return pat.parse(self.rhs)

    @functools.lru_cache(maxsize=None)  # a rule is declared into every e-graph
    def egglog(self, ruleset: str) -> str:
        """A rewrite; a rule with conditions (egglog facts over the analyses and primitives; the
        roots are ``__lhs``, ``__lhs2``...) or several roots is a rule of queries and unions."""
        tail = f':ruleset {ruleset} :name "{self.name}"'
        pairs = [(pat.to_egg(lhs), pat.to_egg(rhs)) for lhs, rhs in self.pairs()]
        if not self.when and len(pairs) == 1:
            return f"(rewrite {pairs[0][0]} {pairs[0][1]} {tail})"
        names = ["__lhs"] + [f"__lhs{i}" for i in range(2, len(pairs) + 1)]
        query = " ".join(f"(= {n} {lhs})" for n, (lhs, _) in zip(names, pairs))
        union = " ".join(f"(union {n} {rhs})" for n, (_, rhs) in zip(names, pairs))
        return f"(rule ({query} {self.when}) ({union}) {tail})"

    def describe(self) -> str:
        return "; ".join(f"{pat.show(lhs)} -> {pat.show(rhs)}" for lhs, rhs in self.pairs())


def rules(family: Family, table, exactness: Exactness = Exactness.EXACT, **common) -> list[Rule]:
    """Rules from rows ``(name, lhs, rhs, *extras)``, each extra known by its type: a string is the why, a ``when(...)``
    the guard, an ``Exactness`` the row's own, a dict further fields; ``common`` fields apply to every tuple row."""
    return [row if isinstance(row, Rule) else _row(family, {"exactness": exactness, **common}, *row) for row in table]


def _row(family: Family, fields: dict, name: str, lhs: str, rhs: str, *extras) -> Rule:
    for x in extras:
        fields.update({"why": x} if isinstance(x, str) else {"when": x} if isinstance(x, Guard) else
                      {"exactness": x} if isinstance(x, Exactness) else x)
    return Rule(name, lhs, rhs, family, **fields)


def reverse(rule: Rule, family: Family, guard: Guard = Guard(), **fixed) -> Rule:
    """The ``-rev`` rule: right side back into left side (decompositions of fusions), under ``guard``;
    variables the right side does not bind (a constant its condition pinned) take ``fixed`` values."""
    def pin(text: str) -> str:
        for name, value in fixed.items():
            text = re.sub(rf"\?{name}\b", pat.literal(value), text)
        return text
    return Rule(f"{rule.name}-rev", pin(rule.rhs), pin(rule.lhs), family, rule.exactness, when=guard,
                why=f"reverse of {rule.name}", sample=tuple((v, x) for v, x in rule.sample if v not in fixed))


def catalogue() -> dict[str, Rule]:
    """All rules by name, across families; names are unique."""
    from . import (algebra, cancellation, canonical, decomposition, functions, fusion, precision, sharding, stability)
    table: dict[str, Rule] = {}
    for module in (stability, cancellation, functions, algebra, canonical, fusion, precision, decomposition, sharding):
        for r in module.RULES:
            if r.name in table:
                raise RuleError(f"duplicate rule name {r.name!r}")
            if (r.exactness is Exactness.UNSAFE) != bool(r.counterexample):
                raise RuleError(f"{r.name}: in the catalogue, an unsafe rule (and only one) "
                                "carries the counterexample that shows it wrong")
            table[r.name] = r
    return table


def select(spec=None) -> list[Rule]:
    """Rules for a run: None, all not unsafe (sharding runs as its own stage); else families, names, Rules."""
    everything = catalogue()
    if spec is None:
        return [r for r in everything.values()
                if r.exactness is not Exactness.UNSAFE and r.family is not Family.SHARDING]
    chosen, families = [], {f.value: f for f in Family}
    for item in ([spec] if isinstance(spec, (str, Rule)) else spec):
        if isinstance(item, Rule):
            chosen.append(item)
        elif item in families:
            chosen.extend(r for r in everything.values()
                          if r.family is families[item] and r.exactness is not Exactness.UNSAFE)
        elif item in everything:
            chosen.append(everything[item])
        else:
            raise RuleError(f"unknown ruleset or rule {item!r}; families: {sorted(families)}")
    return list({r.name: r for r in chosen}.values())
