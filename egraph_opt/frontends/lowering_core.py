"""What lowers a call the table (``lowering.lowering_of``) does not, by mechanism, so that the frontend
covers the Core ATen opset (``lowering.FALLBACKS``, in this order): a call of constants is computed;
an ATen op affine in its floating operands (flips, pads, scatters, pooling, their gradients) is run
to find what it reads; any other is traced through torch's decompositions. Exact, or it stays a call."""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import fx
from torch._decomp import decomposition_table
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.node import map_aggregate

from . import forms
from .effects import functional, torchs_own
from .lowering import CONSTANT, FALLBACKS, Ctx, Parts, Unsupported, known, lower, lowering_of
from ..lang.ops import shape_attr
from ..lang.program import OpaqueRef, leaves
from ..lang.term import Term

_FOLD_LIMIT = 1 << 24  # elements: a constant larger than this stays a call
_DENSE_LIMIT = 1 << 22  # elements of the weights of an op that adds up elements: larger stays a call
#: calls whose lowering does more work than they do: cumsum's sums over an n x n mask; as a model's code spells them,
#: group and instance norm's moments in separate passes (5-11x and 3x the call on CPU), roll's gather (5x), an
#: adaptive pool's means one axis at a time (2x): beside an attention a plan fuses, they made it slower than eager
#: (their core overloads, met inside other decompositions, still lower)
_aten = torch.ops.aten
COSTLIER = {torch.cumsum, "cumsum", _aten.cumsum.default, F.group_norm, torch.group_norm, _aten.group_norm.default,
            F.instance_norm, torch.instance_norm, _aten.instance_norm.default, torch.roll, "roll", F.adaptive_avg_pool2d,
            _aten.adaptive_avg_pool2d.default}


def _fold(node: fx.Node, args: tuple, kwargs: dict, c: Ctx) -> Term | None:
    """A call of constants the trace closed over, a number, or positions in a decomposition: computed here, once per
    signature. Other tensors of sizes alone (``arange(T)``) stay calls the plan computes once, for size families."""
    operands = [a for a in leaves((args, kwargs)) if isinstance(a, (Term, OpaqueRef))]
    if "empty" in str(getattr(node.target, "__name__", node.target)) or not hasattr(c.out, "shape") \
            or math.prod(c.out.shape) > _FOLD_LIMIT or not all(known(a) or getattr(a, "op", "") == "const" and
                                                               id(a) in c.info_of for a in operands):
        return None  # empty: no value
    value = map_aggregate((args, kwargs), lambda a: a if not isinstance(a, Term) else c.params[a.attrs[0]]
                          if a.op == "param" else torch.tensor(a.attrs[0], dtype=c.info(a).dtype))
    try:
        out = _call(node, *value)
    except Exception:  # noqa: BLE001 - any call that cannot run on these constants stays a call
        return None
    if not isinstance(out, torch.Tensor) or out.device.type == "meta":
        return None
    if not (operands or _DECOMPOSING) and out.dim():  # a number, made a tensor of sizes (torch.full(s.shape, v))
        number = out.flatten()[0].clone()
        return Term("expand", (c.constant(number),), (shape_attr(out.shape),)) if bool((out == number).all()) else None
    if out.dim() == 0 and out.dtype.is_floating_point and float(out.float()) == out.item() and \
            all(known(a, CONSTANT) for a in operands):  # of the trace's tensors: one (y[:, 0] = 5.0 writes it)
        return Term.const(out.item())  # a number float32 holds (GPT-2's torch.full([], scale)): as rules know it
    return c.constant(out)


def _no_input(terms: list) -> bool:
    """Results of calls, constants and numbers made tensors only: what a program builds of sizes alone
    (a causal mask) stays a call, as size families need, which the built plan computes once."""
    return all(t.op == "opaque" or known(t) or t.op == "expand" and known(t.args[0]) for t in terms)


def _call(node: fx.Node, args, kwargs):
    fn = functional(node.target) or node.target  # never writes into its operands
    return getattr(args[0], fn)(*args[1:], **kwargs) if node.op == "call_method" else fn(*args, **kwargs)


def _affine(node: fx.Node, args: tuple, kwargs: dict, c: Ctx) -> Term | Parts | None:
    """An ATen op whose (first) result is ``W v + b`` of its floating operands v, W and b fixed by shapes and constants
    (``_weights``): one gather of the operands (and b) at a constant index, weighted and summed."""
    data = [a for a in leaves((args, kwargs)) if isinstance(a, Term) and not known(a)]  # v: their elements
    out = c.out[0] if isinstance(c.out, tuple) else c.out
    if not isinstance(node.target, torch._ops.OpOverload) or node.target._schema.is_mutable \
            or torch.Tag.nondeterministic_seeded in node.target.tags or node.target in COSTLIER or _no_input(data) \
            or {c.info(a).dtype for a in data} != {getattr(out, "dtype", None)} or not out.dtype.is_floating_point:
        return None
    sizes, results, c.out = [math.prod(c.info(a).shape) for a in data], c.out, out
    def run(v):  # the op on the float64 elements v: its first result, flat
        parts = iter(v.split(sizes))
        def value(t):  # constants in float64 too
            p = c.params[t.attrs[0]] if known(t) else next(parts).reshape(c.info(t).shape)
            return p.double() if p.is_floating_point() else p
        a, kw = map_aggregate((args, kwargs), lambda t: value(t) if isinstance(t, Term) else t)
        result = node.target(*a, **kw)
        return (result[0] if isinstance(result, (tuple, list)) else result).reshape(-1)
    try:
        with torch.no_grad():
            index, weight, b = _weights(run, sum(sizes))
    except Exception:  # noqa: BLE001 - an op that is no such map, or refuses float64, stays a call
        return None
    flat = [Term("reshape", (a,), (str(n),)) for a, n in zip(data, sizes)]
    if bool((index >= sum(sizes)).any()):  # -0.0, which adds nothing, then b
        flat.append(c.constant(torch.cat([torch.tensor([-0.0], dtype=torch.float64), b]).to(out.dtype)))
    picked = Term("index_select", (forms.concat(flat, -1), c.constant(index.reshape(-1))), (-1,))
    if index.shape[1] == 1 and bool((weight == 1).all()):  # a move: each element one operand's
        result = Term("reshape", (picked,), (shape_attr(out.shape),))
    else:
        picked = Term("reshape", (picked,), (shape_attr((*out.shape, index.shape[1])),))
        if not bool((weight == 1).all()):  # pooling's 1/k as a division by k, as torch computes it
            k = (1 / weight).round()
            exact = bool((1 / k == weight).all())
            picked = Term("div" if exact else "mul", (picked, c.constant(
                (k if exact else weight).to(out.dtype).reshape(*out.shape, -1))))
        result = Term("sum", (picked,), (-1, False))
    return Parts((result, *[None] * (len(results) - 1))) if isinstance(results, tuple) else result


def _weights(run, n: int) -> tuple:
    """(index, weight, b): output j of ``run`` (affine in v, n elements) is sum_k weight[j, k] v[index[j, k]] (-0.0), +
    b; b is run(0); positions run at once (a move) or one at a time; random operands check it."""
    b = run(torch.zeros(n, dtype=torch.float64))
    if b.dtype != torch.float64:
        raise Unsupported("a result of another dtype")
    u, v = torch.randn(2, n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    if not torch.allclose(run(u + 2 * v) - b, run(u) + 2 * run(v) - 3 * b, rtol=1e-9, atol=1e-9):  # before the dense
        raise Unsupported("not affine")  # weighing below (n runs): a batch norm over its statistics, a clamp
    at, rows = run(torch.arange(1.0, n + 1, dtype=torch.float64)) - b, torch.arange(len(b))  # 0: reads none
    index = torch.where(at > 0, (at - 1).clamp(0, n - 1), n + 1 + rows).long()[:, None]
    weight = torch.ones(index.shape, dtype=torch.float64)
    if _reads(run, n, index, weight, b):
        return index, weight, b
    if n * len(b) > _DENSE_LIMIT:
        raise Unsupported("not a move, and too many elements to weigh one by one")
    w = (torch.vmap(run)(torch.eye(n, dtype=torch.float64)) - b).T
    reads = w != 0
    index = reads.to(torch.int8).argsort(dim=1, descending=True, stable=True)[:, :int(reads.sum(1).max())]
    weight = w.gather(1, index)
    index, weight = torch.where(weight != 0, index, n), torch.where(weight != 0, weight, 1.0)
    with_b = (b != 0) | ~reads.any(1)  # b itself where no element is read: its sign too
    if bool(with_b.any()):
        index = torch.cat([index, torch.where(with_b, n + 1 + rows, n)[:, None]], 1)
        weight = torch.cat([weight, torch.ones(len(b), 1, dtype=torch.float64)], 1)
    if not _reads(run, n, index, weight, b):
        raise Unsupported("not affine")
    return index, weight, b


def _reads(run, n: int, index, weight, b) -> bool:
    """Whether ``run`` is that gather at random operands and at inf, -inf, NaN (``nan_to_num``: identity on finites)."""
    v = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    special = v.clone()
    special[0::6], special[2::6], special[4::6] = math.inf, -math.inf, math.nan
    return all(torch.allclose(run(p), (torch.cat([p, torch.tensor([-0.0], dtype=torch.float64), b])[index] * weight)
                              .sum(1), rtol=1e-9, atol=1e-12, equal_nan=True) for p in (v, special))


@functools.cache
def decompositions() -> dict:
    """torch's table to the Core ATen opset, less the ops lowered as they are: a composite the
    Term language holds whole (softmax, layer norm, attention) stays whole, and its fusions hold."""
    return {op: fn for op, fn in torch.export.default_decompositions().items() if not lowering_of(op)}


_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd  # such an overload decomposes as it is traced
_TRACED: dict = {}  # a call's spelling and operand shapes -> its Core ATen graph, or None
_DECOMPOSING: set = set()  # the calls whose decompositions are being lowered


def _decomposed(node: fx.Node, args: tuple, kwargs: dict, c: Ctx) -> Term | None:
    """A call traced by torch's own decompositions and lowered op by op (None where one stays a call):
    a torch function (``F.pad``) into the Core ATen opset, a core overload (``aten.elu``) by its own."""
    terms = [a for a in leaves((args, kwargs)) if isinstance(a, (Term, OpaqueRef))]
    if not torchs_own(node) or not (hasattr(c.out, "shape") or isinstance(c.out, (tuple, list))) or node.target in _DECOMPOSING | COSTLIER \
            or any(not isinstance(t, Term) for t in terms) or _no_input(terms) \
            or isinstance(node.target, torch._ops.OpOverload) and not (node.target in decomposition_table
                                 or node.target.has_kernel_for_dispatch_key(_COMPOSITE)):
        return None
    def call(*tensors):
        it = iter(tensors)
        return _call(node, *map_aggregate((args, kwargs), lambda v: next(it) if isinstance(v, Term) else v))
    key = repr((node.op, node.target, map_aggregate((args, kwargs), lambda v: (
        tuple(c.info(v).shape), c.info(v).dtype) if isinstance(v, Term) else v)))
    if key not in _TRACED:  # a call repeated in each block of a model is traced once
        try:
            empties = [torch.empty(c.info(t).shape, dtype=c.info(t).dtype) for t in terms]
            own = {node.target: decomposition_table[node.target]} if node.target in decomposition_table else {}
            _TRACED[key] = make_fx(call, decomposition_table=decompositions() | own, tracing_mode="fake")(*empties)
        except Exception:  # noqa: BLE001 - what torch cannot trace stays the call it was
            _TRACED[key] = None
        if len(_TRACED) > 256:
            _TRACED.pop(next(iter(_TRACED)))
    return _lowered_graph(_TRACED[key], terms, node.target, c) if _TRACED[key] is not None else None


def _lowered_graph(gm: fx.GraphModule, terms: list, target, c: Ctx) -> Term | Parts | None:
    """A call's decomposition lowered node by node on its operands ``terms``: its results that
    every node they read lowers (a node that does not, and all it feeds, is None)."""
    values: dict = {}
    operands = iter(terms)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            values[n] = next(operands)
        elif n.op == "get_attr":
            values[n] = c.constant(getattr(gm, n.target))
        elif n.op == "output":
            out = map_aggregate(n.args[0], lambda a: values[a] if isinstance(a, fx.Node) else a)
            if isinstance(out, (tuple, list)) and any(isinstance(t, Term) for t in out):  # (output,
                return Parts(tuple(t if isinstance(t, Term) else None for t in out))  # mean, rstd)
            return out if isinstance(out, Term) else None
        elif getattr(getattr(n.target, "_schema", None), "is_mutable", False):
            return None  # a write: later reads of the written node would not see it
        elif any(values[i] is None for i in n.all_input_nodes):
            values[n] = None
        else:
            n.meta["egraph_opt"] = map_aggregate(n.meta.get("val"), lambda v: type(c.info(terms[0]))(
                tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v)
            a, kw = map_aggregate((n.args, n.kwargs), lambda v: values[v] if isinstance(v, fx.Node) else v)
            _DECOMPOSING.add(target)  # its decomposition may call it again: lowered or not
            try:
                t = lower(n, a, kw, c.info_of, None, c.params)
            finally:
                _DECOMPOSING.discard(target)
            values[n] = OpaqueRef(n.name, t) if isinstance(t, Parts) else t
    return None


FALLBACKS.extend([_fold, _affine, _decomposed])
