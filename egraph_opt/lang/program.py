"""A captured program: Terms for what the Term language expresses, opaque calls for the rest.

Opaque calls (an op we do not know, a multi-output call) are carried through untouched: their tensor results enter
Terms as ``opaque`` leaves, and the Terms they consume are roots beside the outputs, so all around them is optimized."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.fx.node import map_aggregate

from .term import Term, shapes


@dataclass(frozen=True)
class OpaqueRef:
    """A non-tensor result of an opaque call (a tuple, an index tensor pair...), by node name.
    ``parts`` keeps the elements the Term language expresses (``torch.max(x, dim).values``)."""
    name: str
    parts: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class OpaqueCall:
    name: str
    kind: str  # fx op: call_function, call_method, call_module
    target: Any
    args: tuple  # leaves: Term, OpaqueRef or plain Python values
    kwargs: dict
    meta: tuple | None = None  # (shape, torch dtype) when the result is one tensor

    def describe(self) -> str:
        target = self.target if isinstance(self.target, str) else getattr(
            self.target, "__qualname__", repr(self.target))
        return f"{self.name} = {self.kind} {target}"


WRITE = torch.ops.aten.copy_.default  # an input written back (``effects.mutations``): an opaque call of the program


def leaves(tree) -> list:
    found: list = []
    map_aggregate(tree, lambda leaf: found.append(leaf))
    return found


@dataclass(frozen=True)
class Program:
    inputs: tuple[Term, ...]
    outputs: Any  # the function's return structure, leaves Term / OpaqueRef / Python values
    opaque: dict[str, OpaqueCall] = field(default_factory=dict)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    #: term id -> the repeated submodule instance it was traced in ("h.3"), for templates
    scopes: dict[int, str] = field(default_factory=dict, compare=False)
    #: (shape, dtype) of opaque leaves that stand for something other than a call (templates)
    leaf_shapes: dict[str, tuple] = field(default_factory=dict, compare=False)
    #: a constant rounded to float32 (``forms.constant``) -> the Python float written: float64 computes with it
    doubles: dict[float, float] = field(default_factory=dict, compare=False)
    #: the user's own calls (``lowering.lower``; in an optimized program ``pipeline.own_calls``): torch's plain kernel
    own: tuple = field(default=(), compare=False)
    #: shape and dtype of every term, by id, filled once by ``meta()``; a derived program
    #: (``replace``, ``with_roots``) starts empty
    _meta: dict[int, tuple] = field(default_factory=dict, init=False, compare=False, repr=False)

    def written(self) -> tuple[int, ...]:
        """The inputs, by position, the program writes back into (``WRITE`` calls, made after all else)."""
        into = {c.args[0].attrs[0] for c in self.opaque.values() if c.target is WRITE}
        return tuple(i for i, t in enumerate(self.inputs) if t.attrs[0] in into)

    def roots(self) -> list[Term]:
        """Terms the rest of the program needs: outputs and operands of opaque calls."""
        found = [x for x in leaves(self.outputs) if isinstance(x, Term)]
        for call in self.opaque.values():
            found += [x for x in leaves((call.args, call.kwargs)) if isinstance(x, Term)]
        return list({id(t): t for t in found}.values())

    def meta(self) -> dict[int, tuple]:
        """Shape and dtype of every term: inferred once per program, for the analyses, costs and backends."""
        if not self._meta:
            self._meta.update(shapes(self.roots(), self.leaf_meta()))
        return self._meta

    def leaf_meta(self) -> dict[str, tuple]:
        """(shape, dtype) of each opaque tensor result, for shape inference over the Terms."""
        return {**self.leaf_shapes, **{n: c.meta for n, c in self.opaque.items() if c.meta is not None}}

    def pruned(self) -> Program:
        """The program without opaque calls or parameters no output or write-back needs (a captured constant that
        lowering folded to a number: a program that reads no parameter is one of numbers, sampled and widened as one)."""
        needed, seen = set(), set()  # seen: terms walked once for all calls (a walk per call is quadratic)
        stack = leaves(self.outputs) + [OpaqueRef(n) for n, c in self.opaque.items() if c.target is WRITE]
        while stack:
            item = stack.pop()
            if isinstance(item, Term):
                if id(item) in seen:
                    continue
                seen.add(id(item))
                stack.extend(item.args)
            if isinstance(item, Term) and item.op == "param":
                needed.add(("param", item.attrs[0]))
            name = item.name if isinstance(item, OpaqueRef) else \
                item.attrs[0] if isinstance(item, Term) and item.op == "opaque" else None
            if name is not None and name not in needed and name in self.opaque:
                needed.add(name)
                call = self.opaque[name]
                stack.extend(leaves((call.args, call.kwargs)))
        return replace(self, opaque={n: c for n, c in self.opaque.items() if n in needed},
                       params={n: p for n, p in self.params.items() if ("param", n) in needed})

    def with_roots(self, new: dict[int, Term]) -> Program:
        """The same program with each root term (by id) replaced by its optimized term."""
        swap = lambda leaf: new.get(id(leaf), leaf) if isinstance(leaf, Term) else leaf  # noqa: E731
        opaque = {n: replace(c, args=map_aggregate(c.args, swap), kwargs=map_aggregate(c.kwargs, swap))
                  for n, c in self.opaque.items()}
        return replace(self, outputs=map_aggregate(self.outputs, swap), opaque=opaque)
