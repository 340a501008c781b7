"""Terms: immutable DAG nodes of the op table, walked iteratively (models are deeper than Python's
recursion limit), printed in infix, and evaluated by the ops' torch implementations.

>>> x = Term.input("x", (2, 3))
>>> t = Term("div", (Term("exp", (x,)), Term("sum", (Term("exp", (x,)),), (-1, True))))
>>> pretty(t)
'exp(x) / sum(exp(x), -1, True)'
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch

from .ops import OPS, ATTR_SORTS, parse_shape, shape_attr


class TermError(ValueError):
    """A term that does not fit the op table (unknown op, wrong arity or attribute type)."""


@dataclass(frozen=True, eq=False)
class Term:
    """One op applied to operand terms and attributes. Identity is structure's stand-in: the
    frontends and the extractor create one Term per value, so shared subterms are shared objects."""

    op: str
    args: tuple[Term, ...] = ()
    attrs: tuple = ()
    _key: tuple = field(init=False, repr=False)

    def __post_init__(self):
        spec = OPS.get(self.op)
        if spec is None:
            raise TermError(f"unknown op {self.op!r}")
        if len(self.args) != spec.arity or len(self.attrs) != len(spec.attrs):
            raise TermError(f"{self.op} takes {spec.arity} operands and attributes "
                            f"{[a for a, _ in spec.attrs]}, got {len(self.args)} and {self.attrs!r}")
        for value, (name, sort) in zip(self.attrs, spec.attrs):
            if type(value) is not ATTR_SORTS[sort] and not (sort == "f64" and type(value) is int):
                raise TermError(f"{self.op}.{name} must be {sort}, got {value!r}")
        attrs = tuple(float(v) if s == "f64" else v for v, (_, s) in zip(self.attrs, spec.attrs))
        object.__setattr__(self, "attrs", attrs)
        object.__setattr__(self, "_key", (self.op, tuple(id(a) for a in self.args), attrs))

    @staticmethod
    def input(name: str, shape=(), dtype: str = "float32") -> Term:
        return Term("input", (), (name, shape_attr(shape), dtype))

    @staticmethod
    def const(value: float) -> Term:
        return Term("const", (), (float(value),))

    def __repr__(self) -> str:
        return f"Term({pretty(self)})"


def postorder(roots: Iterable[Term]) -> list[Term]:
    """Every distinct term reachable from ``roots``, operands before users, without recursion."""
    seen: set[int] = set()
    order: list[Term] = []
    for root in roots:
        stack: list[tuple[Term, bool]] = [(root, False)]
        while stack:
            term, expanded = stack.pop()
            if expanded:
                order.append(term)
                continue
            if id(term) in seen:
                continue
            seen.add(id(term))
            stack.append((term, True))
            stack.extend((a, False) for a in reversed(term.args) if id(a) not in seen)
    return order


def op_counts(roots: Iterable[Term]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in postorder(roots):
        if not OPS[t.op].is_leaf:
            counts[t.op] = counts.get(t.op, 0) + 1
    return dict(sorted(counts.items()))


def _leaf_text(t: Term) -> str:
    if t.op == "const":
        return repr(t.attrs[0])
    return t.attrs[0]  # input, param and opaque are known by name


_INFIX_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "@": 3, "**": 4}


def pretty(root: Term, names: dict[int, str] | None = None) -> str:
    """Infix text of a term; ``names`` maps term ids to the text to print instead (pattern vars)."""
    names = names or {}
    text: dict[int, tuple[str, int]] = {}  # id -> (text, precedence)
    for t in postorder([root]):
        if id(t) in names:
            text[id(t)] = (names[id(t)], 9)
            continue
        spec = OPS[t.op]
        if spec.is_leaf:
            text[id(t)] = (_leaf_text(t), 9)
        elif spec.infix:
            prec = _INFIX_PRECEDENCE[spec.infix]
            left, right = (text[id(a)] for a in t.args)
            lhs = left[0] if left[1] >= prec else f"({left[0]})"
            rhs = right[0] if right[1] > prec else f"({right[0]})"
            text[id(t)] = (f"{lhs} {spec.infix} {rhs}", prec)
        elif t.op == "neg":
            inner = text[id(t.args[0])]
            text[id(t)] = ("-" + (inner[0] if inner[1] >= 9 else f"({inner[0]})"), 8)
        else:
            parts = [text[id(a)][0] for a in t.args] + [repr(v) if isinstance(v, str) else str(v)
                                                        for v in t.attrs]
            text[id(t)] = (f"{t.op}({', '.join(parts)})", 9)
    return text[id(root)][0]


def evaluate(roots: list[Term], env: dict[str, torch.Tensor], *, reference: bool = False,
             record: dict[int, object] | None = None) -> list[torch.Tensor]:
    """Run terms with the ops' torch implementations. ``env`` binds input, param and opaque names.

    With ``reference=True`` every floating value is computed in float64 and float casts are
    identities: the exact-arithmetic stand-in that rules and optimized programs are checked against.
    """
    values: dict[int, object] = {} if record is None else record
    for t in postorder(roots):
        spec = OPS[t.op]
        if t.op == "const":
            values[id(t)] = t.attrs[0]
        elif spec.is_leaf:
            name = t.attrs[0]
            if name not in env:
                raise KeyError(f"no value bound for {t.op} {name!r}")
            value = env[name]
            if reference and isinstance(value, torch.Tensor) and value.is_floating_point():
                value = value.double()
            values[id(t)] = value
        elif reference and t.op == "cast" and t.attrs[0].startswith(("float", "bfloat")):
            values[id(t)] = values[id(t.args[0])]
        else:
            args = [values[id(a)] for a in t.args]
            if not any(isinstance(a, torch.Tensor) for a in args):  # constant folding of scalars
                args = [torch.tensor(a, dtype=torch.float64) for a in args]
                values[id(t)] = spec.impl(*args, *t.attrs).item()
            else:
                values[id(t)] = spec.impl(*args, *t.attrs)
    return [values[id(r)] for r in roots]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def shapes(roots: list[Term], leaf_meta: dict[str, tuple] | None = None
           ) -> dict[int, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of every term, by running the ops on meta tensors (no data, no compute).
    Inputs and params carry theirs; ``leaf_meta`` gives opaque leaves' (shape, dtype)."""
    env: dict[str, torch.Tensor] = {}
    for t in postorder(roots):
        if t.op in ("input", "param"):
            env[t.attrs[0]] = torch.empty(parse_shape(t.attrs[1]), dtype=getattr(torch, t.attrs[2]),
                                          device="meta")
        elif t.op == "opaque":
            if not leaf_meta or t.attrs[0] not in leaf_meta:
                raise KeyError(f"no shape known for opaque {t.attrs[0]!r}")
            shape, dtype = leaf_meta[t.attrs[0]]
            env[t.attrs[0]] = torch.empty(shape, dtype=dtype, device="meta")
    values: dict[int, object] = {}
    evaluate(roots, env, record=values)
    return {k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else ((), torch.float64)
            for k, v in values.items()}
