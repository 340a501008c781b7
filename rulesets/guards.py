"""A rule's guard as data: facts over the analyses of what its left side binds, parsed once.

One operator table and one evaluator serve every reader: the egglog text a rule lowers to (``str``), why a rule did not
fire (``ematch.py``, over a snapshot's analyses) and regimes (``regimes.py``, over intervals or sampled values, floats
or tensors: a plan may select on the device). The caller answers the analyses (``ask``); a guard computes with them.
>>> g = when("(positive ?x)", "(<= (hi ?x) 255.0)")
>>> str(g + g.rename({"x": "y"}))
'(positive ?x) (<= (hi ?x) 255.0) (positive ?y) (<= (hi ?y) 255.0)'
>>> g.holds({"x": "t"}, intervals(lambda t: (2.0, 300.0)))
False
"""
from __future__ import annotations

import functools
import json
import operator
from dataclasses import dataclass
from typing import Callable, Iterable

from egraph_opt.egraph.range_rules import ANALYSES
from egraph_opt.lang import pattern as pat
from egraph_opt.lang.pattern import Var

#: a guard's operators: egglog's primitives (``+`` also joins Strings: a shape attribute built from sizes), in Python
OPERATORS = {**pat.ARITHMETIC, "=": operator.eq, "!=": operator.ne, "<": operator.lt,
             ">": operator.gt, "<=": operator.le, ">=": operator.ge, "abs": abs, "min": min,
             "max": max, "to-string": lambda n: str(int(n))}
#: the sign relations as facts of an interval (lo, hi): bools, or tensors of them
SIGNS = {"positive": lambda lo, hi: lo > 0, "nonneg": lambda lo, hi: lo >= 0,
         "negative": lambda lo, hi: hi < 0, "nonzero": lambda lo, hi: (lo > 0) | (hi < 0)}
#: heads an interval per operand decides, elementwise on tensors too (Python's min and max are not)
INTERVAL_HEADS = frozenset({*SIGNS, "lo", "hi", "<", "<=", ">", ">=", *pat.ARITHMETIC})


class Num(float):
    """A number as written: its text lowers unchanged (``1e4`` stays so, an i64 stays one)."""

    def __new__(cls, text: str):
        self = super().__new__(cls, text)
        self.text = text
        return self

    def __str__(self):
        return self.text


@dataclass(frozen=True)
class Fact:
    """``(head arg...)``: an analysis or an operator over variables, numbers, strings, facts."""
    head: str
    args: tuple

    def __str__(self):
        return f"({' '.join([self.head, *map(_text, self.args)])})"

    def walk(self) -> Iterable:
        yield self
        for a in self.args:
            yield from a.walk() if isinstance(a, Fact) else (a,)

    def value(self, binding: dict, ask: Callable):
        """Its value: variables from ``binding``, analyses from ``ask(head, *operands)``; LookupError if unknown."""
        args = [binding[a.name] if isinstance(a, Var) else a.value(binding, ask) if isinstance(a, Fact)
                else a for a in self.args]
        return OPERATORS[self.head](*args) if self.head in OPERATORS else ask(self.head, *args)

    def rename(self, names: dict[str, str]) -> Fact:
        return Fact(self.head, tuple(Var(names.get(a.name, a.name)) if isinstance(a, Var) else
                                     a.rename(names) if isinstance(a, Fact) else a for a in self.args))


def _text(a) -> str:
    """An operand as egglog spells it: a root of several rewritten together (``__lhs2``) bare."""
    return (a.name if a.name.startswith("__lhs") else f"?{a.name}") if isinstance(a, Var) else \
        json.dumps(a) if type(a) is str else str(a)


class Guard(tuple):
    """The facts that must all hold; ``str`` is the egglog query text."""

    def __str__(self):
        return " ".join(map(str, self))

    def __add__(self, other) -> Guard:
        return when(*self, *other)

    def rename(self, names: dict[str, str]) -> Guard:
        """The same facts about other variables: ``{"x": "y"}`` asks of ?y what it asked of ?x."""
        return Guard(f.rename(names) for f in self)

    def heads(self) -> frozenset:
        return frozenset(e.head for f in self for e in f.walk() if isinstance(e, Fact))

    def variables(self) -> list[str]:
        return list(dict.fromkeys(e.name for f in self for e in f.walk() if isinstance(e, Var)))

    @property
    def over_intervals(self) -> bool:
        """Whether an interval per operand decides it (signs and bounds; no dtype, shape, rank)."""
        return bool(self) and self.heads() <= INTERVAL_HEADS

    def holds(self, binding: dict, ask: Callable):
        """Whether every fact holds: a bool, or a tensor of them where answers are tensors."""
        return functools.reduce(operator.and_, (f.value(binding, ask) for f in self), True)

    def dtypes(self) -> list[tuple[str, str]]:
        """(variable, dtype) of each ``(= (dtype-of ?v) "dtype")``: what a precision rule needs of its operands."""
        return [(f.args[0].args[0].name, f.args[1]) for f in self if f.head == "=" and
                isinstance(f.args[0], Fact) and f.args[0].head == "dtype-of"]

    def check(self, bound: set[str]) -> None:
        """A guard asks only of what the left side binds: an unbound variable matches anything (a typo)."""
        for fact in self:
            for name in set(Guard((fact,)).variables()) - bound:
                if not name.startswith("__lhs"):
                    raise ValueError(f"{str(fact)!r} uses ?{name}, which the left side does not bind")


def intervals(interval: Callable) -> Callable:
    """An ``ask`` answering bounds and signs from ``interval(operand)``, its (lo, hi)."""
    def ask(head: str, x, *rest):
        if head not in SIGNS and head not in ("lo", "hi"):
            raise LookupError(f"{head} is not known from intervals")
        lo, hi = interval(x)
        return SIGNS[head](lo, hi) if head in SIGNS else lo if head == "lo" else hi
    return ask


def parse(text: str) -> Fact:
    """One fact in egglog's syntax: ``(positive ?a)``, ``(<= (hi ?x) 255.0)``."""
    try:
        tree = pat.sexp(text)
    except pat.PatternError:
        tree = None
    if not isinstance(tree, list):
        raise ValueError(f"{text!r}: a guard is one parenthesized fact")
    return _fact(tree, text)


def _fact(tree, text: str):
    if isinstance(tree, str):
        return Var(tree.removeprefix("?")) if tree.startswith(("?", "__lhs")) else \
            json.loads(tree) if tree.startswith('"') else Num(tree)
    if not tree or not isinstance(tree[0], str):
        raise ValueError(f"{text!r} has an empty or headless fact")
    if tree[0] not in ANALYSES and tree[0] not in OPERATORS:
        known = ", ".join(sorted(ANALYSES | OPERATORS.keys()))
        raise ValueError(f"{text!r} asks {tree[0]!r}, which no analysis defines (known: {known})")
    return Fact(tree[0], tuple(_fact(a, text) for a in tree[1:]))


def when(*facts: str | Fact) -> Guard:
    """A guard from facts, each parsed once where given as text."""
    return Guard(f if isinstance(f, Fact) else parse(f) for f in facts)
