"""Size families: the plans of one program at sizes that differ in one variable ``n`` (the cache length of a decode
step, a prompt's length, a batch) share one structure, as ``torch.compile``'s automatic dynamic shapes find. Here ``n``
is found from two plans traced and optimized at two sizes: where every integer that differs between their programs is
affine in ``n`` with a whole slope (``B * H * n``, ``n + 1``), a third size is made from them, not traced, saturated or
built again: it runs one module made from the samples' two (``shared``), its sizes taken on their lines as inputs. Two
plans that both fell back make the family's later sizes fall back at once, with the reason they gave.

Why the rules that made the samples hold at ``n``: a rule's size guards are equalities of sizes (``last-dim``,
``axis-size``, ``d = 2h``), here affine in ``n``, and two affine functions equal at two sizes are equal at all.
Interval guards read no size except through a reduction's count: a family covers sizes from 2 (a size 1 broadcasts,
and traces specialize it) up to ``REACH`` times its larger sample, where its timing verdict is taken to hold; beyond, a
size is traced and becomes a sample. A made size is validated before it runs: the original may branch on a size (a
sliding window), a kernel's limits may read one (a head dim), and two samples show neither. Where torch.export, given
``n`` as a symbol, finds the original one graph whose sizes are affine in it (no branch reads ``n`` in a range), the
first made size's plan serves each size of that range, checked per call as torch.compile's guards check theirs."""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import fx
from torch._C._dynamo.guards import TensorGuards
from torch.fx.node import map_aggregate, map_arg
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..backends.torch_backend import FoldedConstant, Slot, fold_constants, plain_attributes
from ..lang.ops import parse_shape, shape_attr
from ..lang.program import Program
from ..lang.term import Term

REACH = 8
SAMPLES = 3  # kept per family (each holds its module), the newest two that agree last (``record``)
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
    free: tuple | None = None  # the sizes torch.export finds one graph over (``free_sizes``), found once
    serving: Any = None  # the plan made from it that serves the family's sizes (its guard checks them)


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
    """Where the family's size ``n`` is in a call's sizes: ``at``, each ``n`` plus its offset in ``a``."""
    at: tuple[int, ...]
    a: tuple[int, ...]

    @staticmethod
    def of(a: tuple, b: tuple) -> Variable | None:
        at = tuple(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        return Variable(at, a) if at and len({b[i] - a[i] for i in at}) == 1 else None

    def where(self, names: list[str], tensors: tuple) -> str:
        return ", ".join(f"{names[i]}.shape[{d}]" for i, d in self.free(tensors))

    def free(self, tensors: tuple) -> list[tuple[int, int]]:
        """(tensor, dimension) of each size ``n`` is at."""
        return [[(i, d) for i, t in enumerate(tensors) for d in range(t.dim())][k] for k in self.at]

    def check(self, tensors: tuple, most: int, sizes: tuple[int, int] = (2, 1 << 62)) -> Callable[..., bool] | None:
        """torch.compile's C++ check of ``tensors``, ``n`` free in 2..``most`` and ``sizes`` (its places' strides too, but
        contiguity), each of its other places ``n`` plus an offset: one plan for each size (None: not for this call's)."""
        free = self.free(tensors)
        (i, d), held, steps = free[0], [j for j in {j for j, _ in free} if tensors[j].is_contiguous()], [
            (j, e, self.a[k] - self.a[self.at[0]]) for (j, e), k in zip(free, self.at)]
        low, most = max(2, sizes[0]), min(most, sizes[1])
        check = TensorGuards(*tensors, dynamic_dims_sizes=[[None if (j, e) in free else s for e, s in enumerate(
            t.shape)] for j, t in enumerate(tensors)], dynamic_dims_strides=[[None] * t.dim() if j in {f[0] for f in free}
            else list(t.stride()) for j, t in enumerate(tensors)]).check
        return None if not low <= tensors[i].shape[d] <= most else lambda *now: check(*now) and low <= (
            n := now[i].shape[d]) <= most and all(now[j].shape[e] == n + o for j, e, o in steps) and all(
            now[j].is_contiguous() for j in held)

    def n(self, sizes: tuple) -> int | None:
        """The variable's value at ``sizes``, or None if they are not of this family."""
        return None if len(sizes) != len(self.a) or len({sizes[i] - self.a[i] for i in self.at}) != 1 or any(
            s != x for i, (s, x) in enumerate(zip(sizes, self.a)) if i not in self.at) else sizes[self.at[0]]


class Families:
    """The last two samples of each family, by the key of its calls less their sizes."""

    def __init__(self):
        self._samples: dict[tuple, list[Sample]] = {}

    def record(self, key: tuple, sample: Sample) -> None:
        """``sample`` last, after the newest earlier one it agrees with: extraction may price a near tie apart at two
        sizes (Llama's prefill: grouped keys at 8 and 10 tokens, repeated to every head at 9), so 10 pairs with 8."""
        shape, sample.sizes = split(key)
        kept = sorted((s for s in self._samples.pop(shape, []) if s.sizes != sample.sizes),  # re-entered last
                      key=lambda s: _agree(s, sample))  # stable: the newest that agrees next to it
        self._samples[shape] = (kept + [sample])[-SAMPLES:]
        while len(self._samples) > FAMILIES:  # the family sampled least recently goes
            del self._samples[next(iter(self._samples))]

    def find(self, key: tuple) -> tuple[Sample, Sample, Variable, int] | None:
        """The two samples a call of ``key`` can be made from, the variable and its value now."""
        shape, sizes = split(key)
        pair = self._samples.get(shape, [])[-2:]
        if len(pair) < 2 or (variable := Variable.of(pair[0].sizes, pair[1].sizes)) is None:
            return None
        n = variable.n(sizes)
        return None if n is None or not 2 <= n <= REACH * max(s.sizes[variable.at[0]] for s in pair) else \
            (*pair, variable, n)


def _agree(a: Sample, b: Sample) -> bool:
    """Whether ``b``'s optimized program is ``a``'s at its size (on their lines), or both fell back."""
    if (variable := Variable.of(a.sizes, b.sizes)) is None:
        return False
    try:
        at(a.optimized, b.optimized, (a.sizes[variable.at[0]], *[b.sizes[variable.at[0]]] * 2))
    except Apart:
        return False
    return True


def at(a: Any, b: Any, n: tuple[int, int, int], memo: dict | None = None) -> Any:
    """The value at size ``n[2]`` of what is ``a`` at size ``n[0]`` and ``b`` at ``n[1]``: equal parts kept, integers
    that differ on their line (of whole slope), Terms rebuilt with their sharing; ``Apart`` where else they differ."""
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
    """One module for every size of a family: ``a``'s graph (built at size ``span[0]``) taking first, as inputs, each
    integer or shape that differs in ``b``'s (built at ``span[1]``), and those pairs (``at`` gives their values at a
    size); a constant that reads a size (a mask from ``arange(n)``) is computed once per size. Where the samples bound
    one op to different kernels (chosen by latency at each), ``a``'s serves where it takes ``b``'s operands too (each
    is the op: every new prompt length built its own module, GPT-2's oneDNN linear at 8 tokens, not at 9). ``Apart``
    where graphs differ in anything else (a tuned configuration, a region's kernel, which holds its shapes)."""
    graph, env, holes = fx.Graph(owning_module=a), {}, {}
    match, first = dict(zip(b.graph.nodes, a.graph.nodes)), next(iter(a.graph.nodes))
    def hole(u, v):
        same = at(u, v, (*span, span[0]))  # equal or on a line, else Apart
        if type(u) in (int, str) and u != v and (u, v) not in holes:
            with graph.inserting_before(env[first]):
                holes[u, v] = graph.placeholder(f"size_{len(holes)}")
        return holes[u, v] if type(u) in (int, str) and u != v else same
    def copy(x: tuple, y: tuple, name=None) -> fx.Node:  # (op, target, operands in the new graph) of each
        (us, spec), (vs, other) = tree_flatten(x[2]), tree_flatten(y[2])
        if x[:2] != y[:2] or spec != other or x[2][1].get("config") != y[2][1].get("config"):  # tuned, no size
            raise Apart(f"{getattr(x[1], '__name__', x[1])} against {getattr(y[1], '__name__', y[1])}")
        return graph.create_node(*x[:2], *tree_unflatten([hole(u, v) for u, v in zip(us, vs)], spec), name)
    for x, y in zip(a.graph.nodes, b.graph.nodes, strict=True):  # else ValueError
        if isinstance(x.target, FoldedConstant) and isinstance(y.target, FoldedConstant):
            values = [env[r] for r in x.args]  # its steps, each a node: folded again below
            slot = lambda u: values[u] if type(u) is Slot else u  # noqa: E731
            for p, q in zip(x.target.steps, y.target.steps, strict=True):
                values.append(copy((*p[:2], map_aggregate(p[2], slot)), (*q[:2], map_aggregate(q[2], slot))))
            env[x] = values[-1]
            continue
        if x.op in ("get_attr", "call_module"):
            at(getattr(a, x.target), getattr(b, y.target), (*span, span[0]))
        mine, theirs = x.meta.get("kernel"), y.meta.get("kernel")  # (name, the kernels that took the node's operands)
        bound = mine and theirs and mine[0] in theirs[1]  # b's node bound otherwise, by latency: a's kernel serves
        env[x] = copy((x.op, x.target, map_arg((x.args, x.kwargs), env.__getitem__)), (
            y.op, x.target if bound else y.target, map_arg((y.args, y.kwargs), lambda m: env[match[m]])), x.name)
    fold_constants(graph, a.pure, tuple(holes.values()))  # each kept per size
    return plain_attributes(fx.GraphModule(a, graph)), list(holes)

