"""One node's facts, gathered in one place for every stage that prices or runs it: the cost model, pricing, the latency
estimate and the backend's kernel binding. Keys are term ids or e-class ids: both are read the same way."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .layouts import operand_layouts, term_strides
from .ranges import TOP
from ..lang.term import Term, dtype_name, postorder


@dataclass(frozen=True)
class NodeFacts:
    """What may be known of one node: its op and attributes, the intervals, dtypes, exactness (no
    rounding error) and shapes of its operands, and its own interval (None: not known) and dtype."""
    op: str
    attrs: tuple = ()
    operands: tuple = (TOP, TOP, TOP)
    dtypes: tuple = ()
    exact: tuple = ()
    result: tuple | None = None
    dtype: str = "float32"
    constant: bool = False  # every operand derives from parameters and constants only
    shapes: tuple | None = None  # operand shapes, constants left out (None: not all known)
    layouts: tuple = ()  # operand memory layouts, constants left out (): all contiguous
    tensor_dtypes: tuple = ()  # the dtypes of the operands ``shapes`` and ``layouts`` describe


class Facts:
    """NodeFacts of the nodes of one program or e-graph, by key (term or e-class id); each argument maps keys
    to one fact (``dtypes`` default: meta's; ``scalars``, ``exact``, ``constant``: key sets)."""

    def __init__(self, meta: dict, strides: dict | None = None, scalars: Iterable = (), ranges: dict | None = None,
                 dtypes: dict | None = None, exact: Iterable = (), constant: Iterable = ()):
        self.meta, self.strides, self.scalars = meta, strides or {}, set(scalars)
        self.ranges, self.dtypes = ranges or {}, dtypes
        self.exact, self.constant = set(exact), set(constant)

    def __call__(self, op: str, attrs: tuple, args, key) -> NodeFacts:
        tensors = [a for a in args if a not in self.scalars]
        shapes = tuple(self.meta[a][0] for a in tensors) if all(a in self.meta for a in tensors) else None
        return NodeFacts(op, attrs, operands=tuple(self.ranges.get(a, TOP) for a in args),
            dtypes=tuple(map(self.dtype, args)), exact=tuple(a in self.exact for a in args),
            result=self.ranges.get(key, TOP), dtype=self.dtype(key),
            constant=bool(args) and all(a in self.constant for a in args), shapes=shapes,
            layouts=operand_layouts(shapes, [self.strides.get(a) for a in tensors]) if shapes is not None else (),
            tensor_dtypes=tuple(map(self.dtype, tensors)))

    def dtype(self, key) -> str:
        return dtype_name(self.meta[key][1]) if self.dtypes is None else self.dtypes.get(key, "float32")

    def of(self, t: Term) -> NodeFacts:
        return self(t.op, t.attrs, [id(a) for a in t.args], id(t))

    @staticmethod
    def of_program(roots: list[Term], meta: dict, layouts: bool = True, **known) -> Facts:
        """Facts of a program's terms (by id) of shapes ``meta``; ``layouts``: infer strides."""
        return Facts(meta, term_strides(roots, meta) if layouts else None,
                     [id(t) for t in postorder(roots) if t.op == "const"], **known)


def class_constants(classes: dict) -> dict:
    """The e-classes that hold a constant, with its value: each is a Python number, not a tensor."""
    return {cid: n.attrs[0] for cid, nodes in classes.items() for n in nodes if n.op == "const"}
