"""Size families: the plans of one program at sizes that differ in one variable ``n`` (the cache
length of a decode step, a prompt's length, a batch) share one structure, as ``torch.compile``'s
automatic dynamic shapes find a size that changed and trace it symbolically. Here ``n`` is found
from two plans traced and optimized at two sizes: where every integer that differs between their
programs is affine in ``n`` with a whole slope (``B * H * n``, ``n + 1``), a third size is made
from them, not traced or saturated again, then built and validated like any plan. Two plans that
both fell back make the family's later sizes fall back at once, with the reason they gave.

Why the rules that made the samples hold at ``n``: a rule's size guards are equalities of sizes
(``last-dim``, ``axis-size``, ``d = 2h``), here affine in ``n``, and two affine functions equal at
two sizes are equal at all. Interval guards read no size except through a reduction's count: a
family covers sizes from 2 (a size 1 broadcasts, and traces specialize it) up to ``REACH`` times its
larger sample, where its timing verdict is taken to hold; beyond, a size is traced and becomes a
sample. Each size is still validated before its plan runs: the original may branch on a size (a
sliding window, a mask made only past some length) and a kernel's limits may read one (a head dim),
and two samples show neither; a size that fails is traced, as one off the samples' lines is."""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..backends.torch_backend import FoldedConstant, Slot
from ..lang.ops import parse_shape, shape_attr
from ..lang.program import Program
from ..lang.term import Term

REACH = 8
FAMILIES = 64  # kept per decorated program (a family per state, say, for a module rebound often)
_SIZES = re.compile(r"-?\d+(,-?\d+)*")


class Apart(Exception):
    """The two samples differ in something a size does not explain."""


@dataclass
class Sample:
    """One size of a family: its sizes, and the plan made there with what rebuilding it takes."""
    sizes: tuple[int, ...]
    plan: Any  # api.Plan
    program: Program | None = None  # the captured program
    optimized: Program | None = None  # what the plan runs (flat outputs)
    root: torch.nn.Module | None = None  # the traced module that owns its parameters
    returns: Any = None  # the TreeSpec of its outputs
    estimate: Any = None  # what the backend bound its kernels by
    module: fx.GraphModule | None = None  # built from ``optimized``
    shared: Any = None  # the family's module made from the last two samples' (``shared``), or why not


def split(key: tuple) -> tuple[tuple, tuple[int, ...]]:
    """``key`` with each ``torch.Size`` in it replaced by its rank, and the sizes in order."""
    sizes: list[int] = []

    def walk(x):
        if isinstance(x, torch.Size):
            sizes.extend(x)
            return "rank", len(x)
        return tuple(map(walk, x)) if type(x) is tuple else x
    return walk(key), tuple(sizes)


@dataclass(frozen=True)
class Variable:
    """Where the family's size ``n`` is in a call's sizes: ``at``, each of them ``n`` plus its
    offset in ``a`` (a sample's sizes)."""
    at: tuple[int, ...]
    a: tuple[int, ...]

    @staticmethod
    def of(a: tuple, b: tuple) -> Variable | None:
        at = tuple(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        return Variable(at, a) if at and len({b[i] - a[i] for i in at}) == 1 else None

    def where(self, names: list[str], tensors: tuple) -> str:
        places = [f"{name}.shape[{d}]" for name, t in zip(names, tensors) for d in range(t.dim())]
        return ", ".join(places[i] for i in self.at if i < len(places))

    def n(self, sizes: tuple) -> int | None:
        """The variable's value at ``sizes``, or None if they are not of this family."""
        if len(sizes) != len(self.a) or len({sizes[i] - self.a[i] for i in self.at}) != 1 or \
                any(s != x for i, (s, x) in enumerate(zip(sizes, self.a)) if i not in self.at):
            return None
        return sizes[self.at[0]]


class Families:
    """The last two samples of each family, by the key of its calls less their sizes."""

    def __init__(self):
        self._samples: dict[tuple, list[Sample]] = {}

    def record(self, key: tuple, sample: Sample) -> None:
        shape, sample.sizes = split(key)
        kept = [s for s in self._samples.pop(shape, []) if s.sizes != sample.sizes]  # re-entered last
        self._samples[shape] = (kept + [sample])[-2:]
        while len(self._samples) > FAMILIES:  # the family sampled least recently goes
            del self._samples[next(iter(self._samples))]

    def find(self, key: tuple) -> tuple[Sample, Sample, Variable, int] | None:
        """The two samples a call of ``key`` can be made from, the variable and its value now."""
        shape, sizes = split(key)
        pair = self._samples.get(shape, [])
        if len(pair) < 2 or (variable := Variable.of(pair[0].sizes, pair[1].sizes)) is None:
            return None
        n = variable.n(sizes)
        if n is None or not 2 <= n <= REACH * max(s.sizes[variable.at[0]] for s in pair):
            return None
        return (*pair, variable, n)


def at(a: Any, b: Any, n: tuple[int, int, int], memo: dict | None = None) -> Any:
    """The value at size ``n[2]`` of what is ``a`` at size ``n[0]`` and ``b`` at ``n[1]``: equal
    parts kept, integers that differ taken on their line (whose slope must be whole), Terms
    rebuilt with their sharing; ``Apart`` where anything else differs."""
    memo = {} if memo is None else memo
    if type(a) is not type(b):
        raise Apart(f"{type(a).__name__} against {type(b).__name__}")
    if isinstance(a, Term):
        if (id(a), id(b)) not in memo:
            if a.op != b.op:
                raise Apart(f"{a.op} against {b.op}")
            memo[id(a), id(b)] = Term.trusted(a.op, at(a.args, b.args, n, memo), at(a.attrs, b.attrs, n, memo))
        return memo[id(a), id(b)]
    if type(a) is int:
        slope, left = divmod(b - a, n[1] - n[0])
        if left:
            raise Apart(f"{a} and {b} are not on a line of whole slope")
        return a + slope * (n[2] - n[0])
    if isinstance(a, (tuple, list)) and not hasattr(a, "_fields"):  # fx's immutable lists, torch.Size
        if len(a) != len(b):
            raise Apart("lengths differ")
        return type(a)(at(x, y, n, memo) for x, y in zip(a, b))
    if type(a) is dict:
        if a.keys() != b.keys():
            raise Apart("names differ")
        return {k: at(a[k], b[k], n, memo) for k in a}
    if isinstance(a, Program):
        return Program(*(at(getattr(a, f), getattr(b, f), n, memo) for f in ("inputs", "outputs", "opaque", "params")),
                       leaf_shapes=at(a.leaf_shapes, b.leaf_shapes, n, memo))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return dataclasses.replace(a, **{f.name: at(getattr(a, f.name), getattr(b, f.name), n, memo)
                                         for f in dataclasses.fields(a) if f.init})
    if isinstance(a, torch.Tensor):
        if a is b or (a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)):
            return a
        raise Apart("a constant tensor differs")
    if type(a) is str and a != b and _SIZES.fullmatch(a) and _SIZES.fullmatch(b):  # a shape attribute
        return shape_attr(at(parse_shape(a), parse_shape(b), n, memo))
    if a is b or a == b or (type(a) is float and math.isnan(a) and math.isnan(b)):
        return a
    raise Apart(f"{a!r} against {b!r}")


def shared(a: fx.GraphModule, b: fx.GraphModule, span: tuple[int, int]) -> tuple[fx.GraphModule, list]:
    """One module for every size of a family: ``a``'s graph (built at size ``span[0]``) taking first,
    as inputs, each integer or shape that differs in ``b``'s (built at ``span[1]``); those pairs, whose
    values at a size ``at`` gives. A folded constant that reads a size (a mask made from ``arange(n)``)
    is computed on each call, as the original computes it. ``Apart`` where the graphs differ in
    anything else, which each size then builds for itself: a kernel or Triton configuration chosen by
    latency, a region's generated kernel (it holds its shapes)."""
    graph, env, holes = fx.Graph(), {}, {}
    xs, ys = list(a.graph.nodes), list(b.graph.nodes)
    match = dict(zip(ys, xs))

    def hole(u, v):
        if type(u) not in (int, str) or u == v:
            return at(u, v, (*span, span[0]))  # equal, else Apart
        at(u, v, (*span, span[0]))  # on a line, else Apart
        if (u, v) not in holes:
            with graph.inserting_before(env[xs[0]]):
                holes[u, v] = graph.placeholder(f"size_{len(holes)}")
        return holes[u, v]

    def copy(x: tuple, y: tuple, left, right, name=None) -> fx.Node:  # (op, target, operands) of each
        (xs_, spec), (ys_, other) = tree_flatten(x[2]), tree_flatten(y[2])
        if x[:2] != y[:2] or spec != other:
            raise Apart(f"{x[1]} against {y[1]}")
        args, kwargs = tree_unflatten([hole(left(u), right(v)) for u, v in zip(xs_, ys_)], spec)
        return graph.create_node(*x[:2], args, kwargs, name)
    for x, y in zip(xs, ys) if len(xs) == len(ys) else ():
        target = y.target
        if isinstance(x.target, FoldedConstant) and isinstance(y.target, FoldedConstant):
            if _same(x.target.steps, y.target.steps):
                target = x.target
            elif len(x.target.steps) == len(y.target.steps):
                values = [env[r] for r in x.args]  # its steps, each a node
                for p, q in zip(x.target.steps, y.target.steps):
                    slot = lambda u: values[u] if type(u) is Slot else u  # noqa: E731
                    values.append(copy(p, q, slot, slot))
                env[x] = values[-1]
                continue
        if x.op in ("get_attr", "call_module"):
            at(getattr(a, x.target), getattr(b, y.target), (*span, span[0]))
        env[x] = copy((x.op, x.target, (x.args, x.kwargs)), (y.op, target, (y.args, y.kwargs)),
                      lambda u: env[u] if isinstance(u, fx.Node) else u,
                      lambda v: env[match[v]] if isinstance(v, fx.Node) else v, x.name)
    if len(env) != len(ys):
        raise Apart("the graphs built at the two sizes differ in length")
    module = fx.GraphModule(a, graph)
    module.kernels = a.kernels
    return module, list(holes)


def _same(x, y) -> bool:
    try:
        return bool(x == y)
    except RuntimeError:  # tensors of several values: taken as different
        return False
