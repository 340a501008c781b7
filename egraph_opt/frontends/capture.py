"""Capture: torch functions and modules into Programs of Terms, via torch.fx.

Tracing is symbolic (data-dependent control flow is refused, never baked in), then specialized to the example inputs'
shapes: shape queries (``x.shape[-1] ** 0.5``) fold into constants. Calls the Term language does not express become
opaque calls, carried through untouched."""
from __future__ import annotations

import contextlib
import inspect
import io
import logging
import operator
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import sympy
import torch
from torch import fx
from torch._export.verifier import SpecViolationError
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.fx.node import map_aggregate
from torch.utils._sympy.functions import Max, Min
from torch.utils._pytree import tree_flatten, tree_structure, tree_unflatten

from . import lowering, lowering_aten, lowering_core, lowering_einsum, lowering_nn  # noqa: F401 - they register
from .effects import Draws, functional, mutations
from ..lang.ops import shape_attr
from ..lang.program import OpaqueCall, OpaqueRef, Program, leaves
from ..lang.term import Term, dtype_name, topological


class CaptureError(TypeError):
    """The program cannot be captured: says what and where."""


class SideEffect(CaptureError):
    """The program mutates what its caller sees (argument, parameter or buffer): it runs untouched (Terms are pure)."""


class _Tracer(fx.Tracer):
    """fx's tracer, which keeps the type of what the program returns in ``meta["returns"]`` (a pytree spec): fx makes a
    returned dict subclass, a Hugging Face ``ModelOutput``, a dict. ``into``: into torch.nn modules too, so one
    functional spelling per op needs lowering."""

    def __init__(self, into: bool):
        super().__init__()
        self.into, self.depth, self.last = into, 0, None

    def is_leaf_module(self, m, qualname):
        return isinstance(m, tuple(lowering.MODULES)) if self.into else super().is_leaf_module(m, qualname)

    def create_node(self, *args, **kwargs):  # the grad mode it is traced in (torch.no_grad() on forward, or inside)
        (node := super().create_node(*args, **kwargs)).meta["grad"] = torch.is_grad_enabled()
        return node

    def create_arg(self, a):  # the outermost value made an argument, the output's last (a failed trace is dropped)
        self.last, self.depth = a if self.depth == 0 else self.last, self.depth + 1
        made, self.depth = super().create_arg(a), self.depth - 1
        return made


def trace(fn, example_args: tuple = (), functional: bool = False) -> fx.GraphModule:
    """Symbolic fx tracing; where Python control flow reads shapes (Hugging Face models do), torch.export on the example
    inputs (shapes specialized per signature, control flow on values refused); ``functional``: its functional form."""
    root, where = fn if isinstance(fn, torch.nn.Module) else None, getattr(fn, "__qualname__", type(fn).__name__)
    errors = []
    for tracer in () if functional else (_Tracer(True), _Tracer(False)):
        buffers = [(m._buffers, dict(m._buffers)) for m in (root.modules() if root is not None else ())]
        try:
            graph = tracer.trace(fn)
            if any(isinstance(b, fx.Proxy) for table, _ in buffers for b in table.values()):
                raise CaptureError("a buffer assigned a traced value (self.pe = self.pe.to(x.dtype))")
            traced = fx.GraphModule(tracer.root if root is None else root, graph)
            if isinstance(tracer.last, dict) and type(tracer.last) not in (dict, immutable_dict):
                traced.meta["returns"] = tree_structure(tracer.last)
            return traced
        except SideEffect:
            raise
        except Exception as e:  # noqa: BLE001 - fx raises many types; reported together below
            errors.append(f"{type(e).__name__}: {e}")
        finally:  # what the trace assigned is put back: torch.export traces the same code next
            for table, before in buffers:
                table.update((k, v) for k, v in before.items() if table.get(k) is not v)
    if example_args:
        module = fn if isinstance(fn, torch.nn.Module) else _as_module(fn)  # export takes modules
        try:
            return _export(module, tuple(example_args), functional)
        except SideEffect:
            raise
        except Exception as e:  # noqa: BLE001 - export raises many types too
            errors.append(f"torch.export: {type(e).__name__}: {str(e).splitlines()[0]}")
    raise CaptureError(f"cannot trace {where}: {'; '.join(errors[-2:])} (tracing needs control "
                       "flow that does not depend on tensor values)")


def _as_module(fn: Callable) -> torch.nn.Module:
    return type("AsModule", (torch.nn.Module,), {"forward": lambda self, *args: fn(*args)})()


def _export(module: torch.nn.Module, args: tuple, functional: bool = False, shapes: tuple | None = None):
    """torch.export, whose failure prints the partial graph to stderr (twice) and logs a warning: our error says why.
    What a successful one writes is passed on. With ``shapes`` (sizes taken as symbols): the ExportedProgram."""
    cache_pytrees()
    written, logger = io.StringIO(), logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(written):
            exported = torch.export.export(module, _unshared(args), dynamic_shapes=shapes, strict=False)
            if shapes is not None:
                return exported
            try:
                exported = exported.run_decompositions({}) if functional else exported
            except SpecViolationError:  # its retrace loses a submodule's lifted constants (torch.tensor(2) in
                functional = None  # BART's forward): functionalized here instead
    finally:
        logger.setLevel(level)
    sys.stderr.write(written.getvalue())
    return exported.module() if functional is not None else _functionalized(exported.module(), args)


def free_sizes(fn: Callable, tensors: tuple, free: list[tuple[int, int]]) -> tuple[int, int]:
    """The sizes ``n`` at ``free[0]`` ((tensor, dim); the others ``n`` plus their offsets now) over which torch.export
    finds ``fn`` one graph, each of its sizes affine in them: its guards on them (a sliding window's ``n <= w``, a
    branch's ``n != 7``) bound the range holding this call's; (0, 0) where none does or it cannot export."""
    try:
        with torch.no_grad():
            exported = _export(_as_module(fn), tuple(tensors), shapes=(tuple(
                {d: torch.export.Dim.AUTO for j, d in free if j == i} for i in range(len(tensors))),))
        vals, inputs = {n.name: n.meta.get("val") for n in exported.graph.nodes}, exported.graph_signature.user_inputs
        places = [vals[inputs[i]].shape[d].node for i, d in free]  # an int (specialized): AttributeError
        n, base, env = sympy.Symbol("n", integer=True, positive=True), tensors[free[0][0]].shape[free[0][1]], \
            places[0].shape_env
        on, region = {p.expr: n + tensors[i].shape[d] - base for p, (i, d) in zip(places, free)}, sympy.Interval(2, sys.maxsize)
        for guard in [env.simplify(g.expr) for g in env.guards] + [s >= exported.range_constraints[s].lower for s in on]:
            guard = guard.subs(on).replace(Max, sympy.Max).replace(Min, sympy.Min)  # torch's own: sympy's solvers recurse
            region = sympy.solveset(sympy.simplify(guard), n, sympy.Reals).intersect(region)  # Ne: a Union
            region = next((p for p in region.args if p.contains(base)), region) if region.is_Union else region
        sizes = [env.simplify(s.node.expr) for v in vals.values() for t in tree_flatten(v)[0] if isinstance(
            t, torch.Tensor) for s in t.shape if isinstance(s, torch.SymInt)]  # a size no polynomial: PolynomialError
        if not isinstance(region, sympy.Interval) or not region.contains(base) or not all(
                s.free_symbols <= on.keys() and sympy.Poly(s, *on).total_degree() <= 1 for s in sizes):
            return 0, 0
        return (int(sympy.floor(region.inf) + 1 if region.left_open else sympy.ceiling(region.inf)),
                int(sympy.ceiling(region.sup) - 1 if region.right_open else sympy.floor(region.sup)))
    except Exception:  # noqa: BLE001 - export raises many types
        return 0, 0


def _functionalized(module: fx.GraphModule, args: tuple) -> fx.GraphModule:
    """``module`` (an export, writes and all) traced into pure ops: its module stack is lost (no repeated blocks)."""
    spec = []
    traced = make_fx(torch.func.functionalize(lambda *xs: spec.append(tree_flatten(module(*xs))) or spec[0][0],
                                              remove="mutations"))(*args)
    traced._out_spec = spec[0][1]
    return traced


def cache_pytrees() -> None:
    """A Hugging Face model takes and returns its KV cache: transformers registers ``DynamicCache`` as a pytree (for
    torch.export), not an encoder-decoder's ``EncoderDecoderCache`` (T5): its two caches, its flags made from them;
    nor ``StaticCache``: its layers' tensors (the buffers it updates in place, its length), the rest their context."""
    if not _REGISTERED and "transformers" in sys.modules:
        _REGISTERED.append(True)
        with contextlib.suppress(ImportError, ValueError):  # ValueError: registered already (by the user)
            from transformers.cache_utils import EncoderDecoderCache, StaticCache
            from transformers.integrations.executorch import register_dynamic_cache_export_support
            register_dynamic_cache_export_support()
            torch.utils._pytree.register_pytree_node(
                EncoderDecoderCache, lambda c: ([c.self_attention_cache, c.cross_attention_cache], None),
                lambda caches, _: EncoderDecoderCache(*caches), serialized_type_name="transformers.EncoderDecoderCache")
            torch.utils._pytree.register_pytree_node(StaticCache, _static_flatten, _static_unflatten,
                                                     serialized_type_name="transformers.StaticCache")


def _static_flatten(cache) -> tuple[list, tuple]:
    parts = [(layer, tuple(sorted(k for k, v in vars(layer).items() if isinstance(v, torch.Tensor))))
             for layer in cache.layers]
    layers = tuple((type(layer), names, tuple((k, v) for k, v in vars(layer).items() if k not in names))
                   for layer, names in parts)
    return [getattr(layer, k) for layer, names in parts for k in names], (layers, tuple(
        (k, v) for k, v in vars(cache).items() if k != "layers"))


def _static_unflatten(tensors: list, context: tuple):
    from transformers.cache_utils import StaticCache
    (layers, plain), tensors, cache = context, iter(tensors), object.__new__(StaticCache)
    vars(cache).update(plain, layers=[])
    for kind, names, rest in layers:
        cache.layers.append(layer := object.__new__(kind))
        vars(layer).update(rest, **{k: next(tensors) for k in names})
    return cache


_REGISTERED: list = []


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: torch.dtype


class _Recorder(fx.Interpreter):
    """Runs the traced graph on the example inputs, keeping each node's shape or value."""

    def run_node(self, n):
        result = super().run_node(n)
        if n.meta.get("grad") is False and torch.is_grad_enabled() and n.op.startswith("call") and \
                any(getattr(v, "requires_grad", False) for v in leaves(result)):  # a plan would record autograd there
            raise SideEffect(f"{n.name} is computed under torch.no_grad() from values that need grad, with autograd on")
        n.meta["egraph_opt"] = map_aggregate(
            result, lambda v: TensorInfo(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v)
        return result


def _record(gm: fx.GraphModule, example_args: tuple) -> None:
    """Each node's shape or value, from a run on fake tensors (a large input costs no arithmetic); where fake tensors
    cannot follow (a value read from a tensor, an op without a meta kernel), on clones of the example inputs."""
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            _Recorder(gm).run(*(mode.from_tensor(a) for a in example_args))
        return
    except SideEffect:
        raise
    except Exception:  # noqa: BLE001 - any op fake tensors cannot run: the real run says
        pass
    try:
        _Recorder(gm).run(*(a.clone() if a.device.type != "meta" else a for a in example_args))
    except SideEffect:
        raise
    except Exception as e:
        raise CaptureError(f"running the traced program on the example inputs failed: {e}") from e


_SHAPE_QUERIES = {("call_method", "size"), ("call_method", "dim"), ("call_method", "numel"), ("call_function", getattr)}


def _is_static(node: fx.Node, static: set[str]) -> bool:
    """True when a non-tensor node's value follows from shapes alone (safe to fold per signature)."""
    info = node.meta.get("egraph_opt")
    if any(isinstance(v, TensorInfo) for v in leaves(info)):
        return False
    if (node.op, node.target) in _SHAPE_QUERIES:
        return True
    return node.op == "call_function" and bool(node.all_input_nodes) and all(i.name in static for i in node.all_input_nodes)


def _unshared(args: tuple) -> tuple:
    """``args`` with each one sharing memory with an earlier one cloned: torch.export makes one fake tensor of one real
    tensor, so a tensor passed twice (``model(ids, labels=ids)``) would be one input, wrong for a call with two."""
    seen, out = set(), []
    for a in args:
        shared = a.numel() and a.untyped_storage().data_ptr() in seen
        seen.add(a.untyped_storage().data_ptr())
        out.append(a.clone() if shared else a)
    return tuple(out)


def capture(fn: Callable, example_args: tuple, functional: bool = False) -> tuple[Program, fx.GraphModule]:
    """Trace ``fn`` and lower it on ``example_args``: one Program per input signature; ``functional``: torch.export's
    functional form at once (fx traces ``x += y`` as ``x + y``, which only a run of the original shows)."""
    for name, arg in zip(_parameter_names(fn, len(example_args)), example_args):
        if not isinstance(arg, torch.Tensor):
            raise CaptureError(f"argument {name!r} is a {type(arg).__name__}; egraph-opt optimizes "
                               "functions of tensors (close over other values instead)")
    name = getattr(fn, '__qualname__', type(fn).__name__)
    draws = Draws(lambda op: SideEffect(f"{name} draws random numbers ({op}): every run the optimizer "
                                        "made would draw them from the caller's generator"))
    with _CAPTURING, contextlib.ExitStack() as done:  # autocast caches each weight's cast for the rest of its region:
        done.callback(torch.clear_autocast_cache)  # the trace's fake ones would serve the caller's next calls
        with draws:
            gm = trace(fn, example_args, functional)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(example_args):
            raise CaptureError(f"{len(example_args)} arguments given, the traced program takes {len(placeholders)}")
        effects, in_place, functional, writes = mutations(gm)
        if effects and functional:  # writes into its own values or arguments: torch.export's functional form writes
            with draws, contextlib.suppress(CaptureError):  # none, or writes arguments back at its end; where it
                again = mutations(pure := trace(fn, example_args, functional=True))  # cannot trace, the writes are why
                (effects, in_place, _, writes), gm = (again, pure) if not again[0] else ((effects, in_place, 0, writes), gm)
        if effects:
            raise SideEffect(f"{name} mutates {', '.join(effects)}")
        with draws:
            _record(gm, example_args)
        program = _program(gm, in_place, writes)
        for key, tensor in program.params.items():  # constants computed while lowering: the plan reads them there
            if key.startswith(lowering.CONSTANT):
                setattr(gm, key, tensor)
        return program, gm


_CAPTURING = threading.RLock()  # fx patches nn.Module.__call__ process-wide: two traces at once broke it for good


def capturing() -> bool:
    """Whether this thread is tracing: a decorated function called in the trace is inlined."""
    return _CAPTURING._is_owned()


def _program(gm: fx.GraphModule, in_place: set[str], writes: set[str] = frozenset()) -> Program:
    """The graph's nodes lowered in order; values that follow from shapes alone fold away."""
    values: dict[str, Any] = {}  # node name -> Term | OpaqueRef | static Python value
    info_of: dict[int, TensorInfo] = {}  # term id -> shape and dtype
    inputs, opaque, params, scopes, seen, static, own = [], {}, {}, {}, set(), set(), []
    output = None
    for node in gm.graph.nodes:
        info = node.meta.get("egraph_opt")
        if node.op == "placeholder":
            values[node.name] = Term.input(node.name, info.shape, dtype_name(info.dtype))
            info_of[id(values[node.name])] = info
            inputs.append(values[node.name])
        elif node.op == "get_attr":
            tensor = params[node.target] = operator.attrgetter(node.target)(gm)
            if not isinstance(tensor, torch.Tensor):
                raise CaptureError(f"attribute {node.target!r} is a {type(tensor).__name__}, not a tensor")
            values[node.name] = Term("param", (), (node.target, shape_attr(tensor.shape), dtype_name(tensor.dtype)))
            info_of[id(values[node.name])] = TensorInfo(tuple(tensor.shape), tensor.dtype)
        elif node.op == "output":
            output = map_aggregate(node.args[0], lambda a: values[a.name] if isinstance(a, fx.Node) else a)
            spec = getattr(gm, "_out_spec", None)  # torch.export flattened the outputs: the caller
            if spec is not None and spec.is_leaf():  # rebuilds them (a cache class cannot hold Terms)
                output = tree_unflatten(list(output), spec)
        elif _is_static(node, static):
            static.add(node.name)
            values[node.name] = info
        else:
            term = values[node.name] = _lowered(node, values, info_of, gm, params, opaque, in_place, own, writes)
            if isinstance(term, Term):  # its scope, over the terms no earlier node made (intermediates too)
                new = [t for t in topological([term], lambda t: () if id(t) in seen else t.args, id)
                       if id(t) not in seen]
                seen.update(map(id, new))
                if scope := _repeated_scope(node):
                    scopes.update((id(t), scope) for t in new if t.args)
    written = [a for n in gm.graph.nodes for a in leaves((n.args, n.kwargs)) if type(a) is float and abs(a) < 3e38]
    doubles = {float(np.float32(a)): a for a in written}  # (no float32 overflow: numpy warns)
    return Program(tuple(inputs), output, opaque, params, scopes, doubles=doubles, own=tuple(own)).pruned()


def _lowered(node: fx.Node, values: dict, info_of: dict, gm: fx.GraphModule, params: dict,
             opaque: dict, in_place: set[str], own: list, writes: set[str]):
    """The node's Term; where the Term language has none, or it writes an argument back, an opaque call of the node (a
    Term leaf for a tensor, else an ``OpaqueRef``)."""
    info = node.meta.get("egraph_opt")
    args, kwargs = map_aggregate((node.args, node.kwargs), lambda a: values[a.name] if isinstance(a, fx.Node) else a)
    term = None if node.name in writes else lowering.lower(node, args, kwargs, info_of, gm, params, own)
    if isinstance(term, Term):
        return term
    shape_dtype = (info.shape, info.dtype) if isinstance(info, TensorInfo) else None
    target = functional(node.target) if node.name in in_place else node.target
    if target is None:  # as an opaque call it would write into a value the e-graph shares
        raise SideEffect(f"{node.name} runs in place ({node.target}) and has no pure form in the Term language")
    opaque[node.name] = OpaqueCall(node.name, node.op, target, args, kwargs, shape_dtype)
    if not isinstance(info, TensorInfo):
        return OpaqueRef(node.name, term)
    term = Term("opaque", (), (node.name,))
    info_of[id(term)] = info
    return term


def returned(outputs: Any) -> Any:
    """``outputs`` as the program returns them: fx holds a returned dict or list as its
    immutable_dict or immutable_list, which the caller must not get."""
    return {k: returned(v) for k, v in outputs.items()} if type(outputs) is immutable_dict else \
        [returned(v) for v in outputs] if type(outputs) is immutable_list else \
        tuple(map(returned, outputs)) if type(outputs) is tuple else outputs


def _repeated_scope(node: fx.Node) -> str | None:
    """The outermost module of the node's stack that is an item of a container (``h.3``,
    ``encoder.layer.5``): the unit transformer-like models repeat."""
    return next((path for path in node.meta.get("nn_module_stack") or {} if path.rsplit(".", 1)[-1].isdigit()), None)


def _parameter_names(fn, n: int) -> list[str]:
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        names = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        names = []
    return (names + [f"arg{i}" for i in range(len(names), n)])[:n]
