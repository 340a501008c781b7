"""Patterns: the s-expression language rules are written in, Herbie and egg style.

``(div (exp ?x) (sum (exp ?x) ?a true))``: ops with operands first and attributes after; ``?x`` is a variable; an
attribute may be a primitive expression such as ``(/ 1.0 ?c)``. One pattern is emitted as egglog text, matched
against Terms and instantiated into Terms.
>>> p = parse("(log (sum (exp ?x) ?a ?k))")
>>> sorted(variables(p).items())
[('a', 'i64'), ('k', 'bool'), ('x', 'Tensor')]
"""
from __future__ import annotations

import functools
import json
import operator
import re
from dataclasses import dataclass
from typing import Union

from .ops import OPS, ATTR_SORTS
from .term import Term, postorder, pretty

TENSOR = "Tensor"


class PatternError(ValueError):
    """A malformed rule pattern: unknown op, wrong arity, a variable used with two sorts."""


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Lit:
    value: object


@dataclass(frozen=True)
class Prim:
    """A primitive computation on attributes, done by egglog when a rule fires."""
    fn: str
    args: tuple


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple
    attrs: tuple


Pattern = Union[Var, Lit, Prim, Node]

ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_TOKEN = re.compile(r'\s*(\(|\)|"(?:[^"\\]|\\.)*"|[^\s()]+)')


def _atom(tok: str) -> Pattern:
    if tok.startswith("?"):
        return Var(tok[1:])
    if tok in ("true", "false"):
        return Lit(tok == "true")
    if tok.startswith('"'):
        return Lit(json.loads(tok))
    try:
        return Lit(int(tok)) if re.fullmatch(r"-?\d+", tok) else Lit(float(tok))
    except ValueError:
        raise PatternError(f"unknown atom {tok!r}") from None


def sexp(text: str) -> list | str:
    """One s-expression as nested lists of tokens: ``(exp ?x)`` -> ``['exp', '?x']`` (patterns, guards)."""
    stack: list[list] = [[]]
    for tok in _TOKEN.findall(text):  # every character is a token or space: nothing is skipped
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) == 1:
                raise PatternError(f"unbalanced ')' in {text!r}")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    if len(stack) != 1 or len(stack[0]) != 1:
        raise PatternError(f"pattern {text!r} is not one expression")
    return stack[0][0]


@functools.lru_cache(maxsize=None)  # a rule's patterns are read at every match and test point (immutable)
def parse(text: str) -> Pattern:
    variables(pattern := _pattern(sexp(text), text))  # sort check
    return pattern


def _pattern(tree: list | str, text: str) -> Pattern:
    if isinstance(tree, str):
        return _atom(tree)
    if not tree or not isinstance(tree[0], str):
        raise PatternError(f"expected an op name in {text!r}")
    head, rest = tree[0], tuple(_pattern(t, text) for t in tree[1:])
    if head in ARITHMETIC:
        return Prim(head, rest)
    if (spec := OPS.get(head)) is None:
        raise PatternError(f"unknown op {head!r} in {text!r}")
    if len(rest) != spec.arity + len(spec.attrs):
        raise PatternError(f"{head} takes {spec.arity} operands and {len(spec.attrs)} attributes in {text!r}")
    return Node(head, rest[:spec.arity], rest[spec.arity:])


def variables(p: Pattern) -> dict[str, str]:
    """Each variable's sort: ``Tensor`` for operands, the egglog sort for attributes."""
    sorts: dict[str, str] = {}
    def note(v: Var, sort: str):
        if sorts.setdefault(v.name, sort) != sort:
            raise PatternError(f"variable ?{v.name} used as {sorts[v.name]} and as {sort}")
    stack = [(p, TENSOR)]
    while stack:
        q, sort = stack.pop()
        if isinstance(q, Var):
            note(q, sort)
        elif isinstance(q, Prim):
            stack.extend((a, sort) for a in q.args)
        elif isinstance(q, Node):
            stack.extend((a, TENSOR) for a in q.args)
            stack.extend((a, s) for a, (_, s) in zip(q.attrs, OPS[q.op].attrs))
        elif isinstance(q, Lit) and sort == TENSOR:
            raise PatternError(f"literal {q.value!r} where a tensor is expected (use (const ...))")
    return sorts


def literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"  # egglog's spelling
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    return str(value)


def to_egg(p: Pattern) -> str:
    """egglog text of a pattern: ops become their CamelCase constructors."""
    if isinstance(p, Var):
        return "?" + p.name
    if isinstance(p, Lit):
        return literal(p.value)
    if isinstance(p, Prim):
        return f"({p.fn} {' '.join(to_egg(a) for a in p.args)})"
    return f"({' '.join([OPS[p.op].egg_name, *(to_egg(a) for a in p.args + p.attrs)])})"


def structural_ids(roots) -> dict[int, int]:
    """Map each term id to a number shared by all structurally equal terms."""
    table, ids = {}, {}
    for t in postorder(roots):
        ids[id(t)] = table.setdefault((t.op, tuple(ids[id(a)] for a in t.args), t.attrs), len(table))
    return ids


def match(p: Pattern, term: Term, canon: dict[int, int], bound: dict | None = None) -> dict | None:
    """Bindings under which ``p`` equals ``term`` (structurally), or None."""
    bound, stack = dict(bound or {}), [(p, term)]
    while stack:
        q, value = stack.pop()
        if isinstance(q, Var):
            if q.name not in bound:
                bound[q.name] = value
            elif not (canon[id(bound[q.name])] == canon[id(value)] if isinstance(bound[q.name], Term)
                      else bound[q.name] == value):
                return None
        elif isinstance(q, (Lit, Prim)):
            try:
                computed = instantiate(q, bound)
            except (KeyError, ArithmeticError):  # a Prim unbound or undefined: a wildcard
                computed = value
            if computed != value:
                return None
        else:
            if not isinstance(value, Term) or value.op != q.op:
                return None
            stack.extend(zip(q.args, value.args))
            stack.extend(zip(q.attrs, value.attrs))
    return bound


def find(p: Pattern, roots) -> list[dict]:
    """All bindings of ``p`` over the terms reachable from ``roots``."""
    canon = structural_ids(roots)
    return [b for t in postorder(roots) if (b := match(p, t, canon)) is not None]


def instantiate(p: Pattern, bindings: dict):
    """Build the Term (or attribute value) a pattern denotes under ``bindings``."""
    if isinstance(p, Var):
        return bindings[p.name]
    if isinstance(p, Lit):
        return p.value
    if isinstance(p, Prim):
        return ARITHMETIC[p.fn](*(instantiate(a, bindings) for a in p.args))
    return Term(p.op, tuple(instantiate(a, bindings) for a in p.args), tuple(instantiate(a, bindings) for a in p.attrs))


def defined(t: Term) -> Term:
    """``t`` as the definition in primitive ops its op declares (``Op.definition``)."""
    bindings = {f"x{i}": a for i, a in enumerate(t.args)}
    bindings.update((name, value) for (name, _), value in zip(OPS[t.op].attrs, t.attrs))
    return instantiate(parse(OPS[t.op].definition), bindings)


def skeleton(p: Pattern) -> tuple[Term, dict[int, str]]:
    """A Term standing for a pattern: variables become named opaque leaves, attribute variables
    their sort's zero; the second result maps term ids to the text a printer should show."""
    names, cache = {}, {}
    def build(q):
        if isinstance(q, Var):
            if q.name not in cache:
                cache[q.name] = Term("opaque", (), (q.name,))
                names[id(cache[q.name])] = q.name
            return cache[q.name]
        attrs = tuple(a.value if isinstance(a, Lit) else ATTR_SORTS[sort]()
                      for a, (_, sort) in zip(q.attrs, OPS[q.op].attrs))
        term = Term(q.op, tuple(build(a) for a in q.args), attrs)
        if any(labels := [_attr_text(a) if isinstance(a, (Var, Prim)) else None for a in q.attrs]):
            shown = [lab if lab else literal(v) for lab, v in zip(labels, attrs)]
            names[id(term)] = f"{q.op}({', '.join([pretty(a, names) for a in term.args] + shown)})"
        return term
    return build(p), names


def _attr_text(a) -> str:
    return a.name if isinstance(a, Var) else f" {a.fn} ".join(map(_attr_text, a.args)) if isinstance(a, Prim) \
        else literal(a.value)


def show(p: Pattern) -> str:
    """Infix text of a pattern, variables printed bare: ``exp(x) / sum(exp(x), a, true)``."""
    term, names = skeleton(p)
    return pretty(term, names)
