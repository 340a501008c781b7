"""Terms: immutable DAG nodes of the op table, walked iteratively (models are deeper than Python's
recursion limit), printed in infix, and evaluated by the ops' torch implementations.
>>> x = Term.input("x", (2, 3))
>>> t = Term("div", (Term("exp", (x,)), Term("sum", (Term("exp", (x,)),), (-1, True))))
>>> pretty(t)
'exp(x) / sum(exp(x), -1, True)'
"""
from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from .mesh import Local, each
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

    def __post_init__(self):
        if (spec := OPS.get(self.op)) is None:
            raise TermError(f"unknown op {self.op!r}")
        if len(self.args) != spec.arity or len(self.attrs) != len(spec.attrs):
            raise TermError(f"{self.op} takes {spec.arity} operands and attributes "
                            f"{[a for a, _ in spec.attrs]}, got {len(self.args)} and {self.attrs!r}")
        for value, (name, sort) in zip(self.attrs, spec.attrs):
            if type(value) is not ATTR_SORTS[sort] and not (sort == "f64" and type(value) is int):
                raise TermError(f"{self.op}.{name} must be {sort}, got {value!r}")
        attrs = tuple(float(v) if s == "f64" else v for v, (_, s) in zip(self.attrs, spec.attrs))
        object.__setattr__(self, "attrs", attrs)

    @staticmethod
    def trusted(op: str, args: tuple, attrs: tuple) -> Term:
        """A term from parts already checked (an extracted e-node): no validation."""
        t = object.__new__(Term)
        t.__dict__.update(op=op, args=args, attrs=attrs)
        return t

    @staticmethod
    def input(name: str, shape=(), dtype: str = "float32") -> Term:
        return Term("input", (), (name, shape_attr(shape), dtype))

    @staticmethod
    def const(value: float) -> Term:
        return Term("const", (), (float(value),))

    def __repr__(self) -> str:
        return f"Term({pretty(self)})"


def topological(roots: Iterable, deps: Callable[[Any], Sequence], key: Callable[[Any], Any]) -> list:
    """Items reachable from ``roots``, each after those ``deps`` says it uses; iterative (deep programs). A cycle
    (an e-graph's classes) is cut where it closes: each item is entered once."""
    order, entered = [], set()
    for root in roots:
        stack = [(root, False)]
        while stack:
            item, ready = stack.pop()
            if ready:
                order.append(item)
            elif key(item) not in entered:
                entered.add(key(item))
                stack.append((item, True))
                stack.extend((d, False) for d in reversed(deps(item)) if key(d) not in entered)
    return order


def postorder(roots: Iterable[Term]) -> list[Term]:
    """Every distinct term reachable from ``roots``, operands before users."""
    return topological(roots, lambda t: t.args, id)


def op_counts(roots: Iterable[Term]) -> dict[str, int]:
    return dict(sorted(Counter(t.op for t in postorder(roots) if not OPS[t.op].is_leaf).items()))


_INFIX_PRECEDENCE = {"<": 0, "+": 1, "-": 1, "*": 2, "/": 2, "@": 3, "**": 4}


def pretty(root: Term, names: dict[int, str] | None = None, width: int | None = None) -> str:
    """Infix text of a term; ``names`` maps term ids to the text to print instead (pattern vars);
    ``width``: its first characters alone, then "..." (a DAG's text can be exponentially long)."""
    names = names or {}
    text: dict[int, tuple[str, int]] = {}  # id -> (text, precedence)
    for t in postorder([root]):
        for a in t.args if width is not None else ():  # operands' texts cut past what the root can show
            text[id(a)] = (text[id(a)][0][:width + 1], text[id(a)][1])
        if id(t) in names:
            text[id(t)] = (names[id(t)], 9)
            continue
        spec = OPS[t.op]
        if spec.is_leaf:
            text[id(t)] = (repr(t.attrs[0]) if t.op == "const" else t.attrs[0], 9)  # others by name
        elif spec.infix:
            prec = _INFIX_PRECEDENCE[spec.infix]
            left, right = (text[id(a)] for a in t.args)
            lhs, rhs = left[0] if left[1] >= prec else f"({left[0]})", right[0] if right[1] > prec else f"({right[0]})"
            text[id(t)] = (f"{lhs} {spec.infix} {rhs}", prec)
        elif t.op == "neg":
            inner = text[id(t.args[0])]
            text[id(t)] = ("-" + (inner[0] if inner[1] >= 9 else f"({inner[0]})"), 8)
        else:
            parts = [text[id(a)][0] for a in t.args] + [repr(v) if isinstance(v, str) else str(v) for v in t.attrs]
            text[id(t)] = (f"{t.op}({', '.join(parts)})", 9)
    shown = text[id(root)][0]
    return shown if width is None or len(shown) <= width else shown[:width - 3] + "..."


def evaluate(roots: list[Term], env: dict[str, torch.Tensor], *, reference: bool = False,
             record: dict[int, object] | None = None, kernels: dict = {}) -> list[torch.Tensor]:
    """Run terms by the ops' reference implementations, or their ``kernels`` where given (``torch_ops.TORCH``); ``env``
    binds input, param and opaque names. ``reference``: in float64, casts as identities (rules and plans' yardstick)."""
    values: dict[int, object] = {} if record is None else record
    folding = _folding_dtype(env, reference)
    for t in postorder(roots):
        spec, impl = OPS[t.op], kernels.get(t.op, OPS[t.op].impl)
        if t.op == "const":
            values[id(t)] = t.attrs[0]
        elif spec.is_leaf:
            if (name := t.attrs[0]) not in env:
                raise KeyError(f"no value bound for {t.op} {name!r}")
            value = env[name]
            values[id(t)] = value.double() if reference and isinstance(value, torch.Tensor) and \
                value.is_floating_point() else value
        elif reference and t.op == "cast" and t.attrs[0].startswith(("float", "bfloat")):
            values[id(t)] = values[id(t.args[0])]
        else:
            args = [values[id(a)] for a in t.args]
            if not spec.mesh and any(isinstance(a, Local) for a in args):  # once per device
                values[id(t)] = each(impl, args, t.attrs)
            elif not any(isinstance(a, (torch.Tensor, Local)) for a in args):  # folding of scalars
                values[id(t)] = impl(*(torch.tensor(a, dtype=folding) for a in args), *t.attrs).item()
            else:
                values[id(t)] = impl(*args, *t.attrs)
    return [values[id(r)] for r in roots]


def _folding_dtype(env: dict, reference: bool) -> torch.dtype:
    """Scalars fold in the program's dtype, as its kernels compute them: float32 for a float32 or
    half-precision program (torch's scalar arithmetic type for both), so 1e30 * 1e30 overflows
    here as it does there; float64 in the reference and for float64 or scalar-only programs.
    >>> x = Term.input("x", ())
    >>> evaluate([Term("mul", (Term.const(1e30), Term.const(1e30)))], {"x": torch.ones(())})
    [inf]
    """
    floating = [v.dtype for v in env.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return torch.float64 if reference or not floating or torch.float64 in floating else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


SCALAR = ((), torch.float64)  # a const: a Python number, which never promotes a tensor's dtype


def infer(op: str, attrs: tuple, operands: Sequence, leaf_meta: dict | None = None) -> tuple:
    """(shape, dtype) of ``op`` over ``operands``, each a tensor's (shape, dtype) or a Python number (a const): the one
    inference of terms and e-classes alike, by the shape kind the op table declares, else by running the op on meta
    tensors. ``leaf_meta``: opaque leaves' (shape, dtype). Raises what the op raises on what it refuses."""
    if op == "const":
        return SCALAR
    if op in ("input", "param"):
        return parse_shape(attrs[1]), getattr(torch, attrs[2])
    if op == "opaque":
        if not leaf_meta or attrs[0] not in leaf_meta:
            raise KeyError(f"no shape known for opaque {attrs[0]!r}")
        return tuple(leaf_meta[attrs[0]][0]), leaf_meta[attrs[0]][1]
    tensor = [isinstance(m, tuple) for m in operands]
    if (found := _by_kind(op, attrs, [m if t else SCALAR for m, t in zip(operands, tensor)], tensor)) is not None:
        return found
    args = [torch.empty(m[0], dtype=m[1], device="meta") if t else m for m, t in zip(operands, tensor)]
    value = OPS[op].impl(*args, *attrs) if any(tensor) else 0.0
    return (tuple(value.shape), value.dtype) if isinstance(value, (torch.Tensor, Local)) \
        else SCALAR  # Local: one device's part


def _by_kind(op: str, attrs: tuple, operands: list[tuple], tensor: list[bool]) -> tuple | None:
    """Shape and dtype by the op's declared kind (cheaper than a run on meta tensors); None: no rule."""
    kind, sizes = OPS[op].shape_rule, [m[0] for m, t in zip(operands, tensor) if t]
    if kind in ("same", "first"):  # first: the shape and dtype of the first operand
        return operands[0]
    if kind == "compare":  # a bool mask of the broadcast operands
        return tuple(torch.broadcast_shapes(*sizes)), torch.bool
    if kind in ("broadcast", "where"):  # where: the dtype of its values, not its condition's
        values = [m[1] for m, t in list(zip(operands, tensor))[kind == "where":] if t]
        dtype = functools.reduce(torch.promote_types, values) if values else None
        return None if dtype is None or op == "div" and not dtype.is_floating_point else \
            (tuple(torch.broadcast_shapes(*sizes)), dtype)
    if kind == "reduce":
        (shape, dtype), (axis, keepdim) = operands[0], attrs[:2]
        return None if not shape or not -len(shape) <= axis < 0 else \
            (shape[:axis] + ((1,) if keepdim else ()) + shape[len(shape) + axis + 1:], dtype)
    if kind == "cast":
        return operands[0][0], getattr(torch, attrs[0])
    if kind == "transpose" and len(operands[0][0]) >= 2 and attrs == (-2, -1):
        (*batch, rows, columns), dtype = operands[0]
        return (*batch, columns, rows), dtype
    if kind == "reshape":  # to the shape its attribute names (a reshape's -1: what is left, as torch)
        shape, known = parse_shape(attrs[0]), math.prod(d for d in parse_shape(attrs[0]) if d != -1)
        if op == "reshape" and -1 in shape:
            if not known:
                return None
            shape = tuple(math.prod(operands[0][0]) // known if d == -1 else d for d in shape)
        return shape, operands[0][1]
    (a, dtype), b = operands[0], operands[1][0] if len(operands) > 1 else ()
    if kind == "matmul" and len(a) >= 2 and len(b) >= 2 and a[-1] == b[-2]:
        return tuple(torch.broadcast_shapes(a[:-2], b[:-2])) + (a[-2], b[-1]), dtype
    if kind == "linear" and len(b) == 2 and a and a[-1] == b[1]:
        return a[:-1] + (b[0],), dtype
    return (a[:-1] + (operands[2][0][-1],), dtype) if kind == "sdpa" and len(a) >= 2 else None


def shapes(roots: list[Term], leaf_meta: dict[str, tuple] | None = None
           ) -> dict[int, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of every term (``infer``); ``leaf_meta`` gives opaque leaves' (shape, dtype)."""
    out: dict[int, tuple] = {}
    for t in postorder(roots):
        out[id(t)] = infer(t.op, t.attrs, [a.attrs[0] if a.op == "const" else out[id(a)] for a in t.args], leaf_meta)
    return out
