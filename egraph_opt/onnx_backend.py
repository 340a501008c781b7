"""ONNX backend: an (optimized) Program back into a ModelProto of standard operators.

Each op of the op table maps, through ``EMIT``, to the standard operator that exists at the
model's opset (LayerNormalization from 17, Gelu from 20, Attention from 23) or to its
decomposition into ops that have one; ``NO_ONNX_FORM`` names the ops that have neither. Spellings
follow what onnxruntime's fusions match (Gelu as Div by sqrt(2), attention as MatMul, Mul, Add,
Softmax, MatMul). Subterms of parameters alone are folded into initializers, as onnxruntime would
at load. Opaque nodes are copied verbatim with their operands renamed. Names, dtypes and symbolic
dims of the graph's inputs and outputs, the opsets and the stored parameters come from the
import's side tables.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from .onnx_converters import DTYPES, ELEM_TYPES
from .onnx_frontend import OnnxProgram
from .ops import OPS, parse_shape
from .program import Program, leaves
from .term import Term, evaluate, postorder, shapes


class OnnxExportError(ValueError):
    """A term that has no ONNX form at this opset: names the op and why."""


SIMPLE = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "maximum": "Max",
          "minimum": "Min", "where": "Where", "neg": "Neg", "exp": "Exp", "log": "Log",
          "sqrt": "Sqrt", "abs": "Abs", "sin": "Sin", "cos": "Cos", "tanh": "Tanh",
          "sigmoid": "Sigmoid", "relu": "Relu", "erf": "Erf", "matmul": "MatMul",
          "softplus": "Softplus"}
#: reductions: ONNX op, and the opset from which its axes are an input rather than an attribute
REDUCE = {"sum": ("ReduceSum", 13), "mean": ("ReduceMean", 18), "max": ("ReduceMax", 18),
          "logsumexp": ("ReduceLogSumExp", 18)}
_SAME_RANK = {"softmax", "log_softmax", "cast", "transpose", "permute", "slice", "concat", "gather",
              "index_select", "layer_norm", "sdpa", "sdpa_masked", "linear", "linear_act", "gelu",
              "conv2d", "batch_norm"}
#: ops of the Term language that ONNX has no operator or decomposition for: export refuses them
NO_ONNX_FORM: frozenset[str] = frozenset()
_NO_NUMPY = {"bfloat16"}  # element types whose parameters cannot be folded through numpy


class Emitter:
    """Builds one graph: Terms to value names, each value emitted once, after what it uses."""

    def __init__(self, src: OnnxProgram, program: Program):
        self.src, self.program, self.opset = src, program, src.opset
        graph = src.model.graph
        self.taken = {v.name for v in list(graph.input) + list(graph.output)}
        self.taken |= {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, onnx.TensorProto] = {}
        self.names: dict[int, str] = {}
        self._dtype: dict[int, str | None] = {}
        self._rank: dict[int, int | None] = {}
        self._consts: dict[tuple, str] = {}
        self._shapes: dict[int, tuple] | None = None
        self._source: dict[int, str] = {}
        self.producer = {out: key for key, call in program.opaque.items() for out in call.target.output}

    # --- names, constants and analyses ---
    def fresh(self, hint: str) -> str:
        name, k = f"eo_{hint}", 0
        while name in self.taken:
            k += 1
            name = f"eo_{hint}_{k}"
        self.taken.add(name)
        return name

    def tensor(self, array: np.ndarray, hint: str) -> str:
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            name = self.fresh(hint)
            self.initializers[name] = numpy_helper.from_array(array, name)
            self._consts[key] = name
        return self._consts[key]

    def ints(self, values, hint: str = "shape") -> str:
        return self.tensor(np.asarray(values, dtype=np.int64).reshape(-1), hint)

    def scalar(self, value: float, dtype: str | None) -> str:
        np_type = helper.tensor_dtype_to_np_dtype(ELEM_TYPES.get(dtype or "float32", 1))
        return self.tensor(np.asarray(value, dtype=np_type), "const")

    def node(self, op_type: str, inputs: list[str], hint: str, **attrs) -> str:
        out = self.fresh(hint)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def dtype(self, t: Term) -> str | None:
        """Element type of a term: from its leaves, casts and the import's value types."""
        for u in postorder([t]):
            if id(u) in self._dtype:
                continue
            if u.op in ("input", "param"):
                found = u.attrs[2]
            elif u.op == "opaque":
                vt = self.src.types.get(u.attrs[0])
                found = DTYPES.get(vt.elem_type) if vt else None
            elif u.op == "cast":
                found = u.attrs[0]
            else:
                args = u.args[1:] if u.op == "where" else u.args
                found = next((self._dtype[id(a)] for a in args if self._dtype[id(a)]), None)
            self._dtype[id(u)] = found
        return self._dtype[id(t)]

    def rank(self, t: Term) -> int | None:
        for u in postorder([t]):
            if id(u) in self._rank:
                continue
            ranks = [self._rank[id(a)] for a in u.args]
            if u.op in ("input", "param"):
                r = len(parse_shape(u.attrs[1]))
            elif u.op == "opaque":
                vt = self.src.types.get(u.attrs[0])
                r = len(vt.shape) if vt and vt.shape is not None else None
            elif u.op == "const":
                r = 0
            elif u.op in REDUCE or u.op in ("var",):
                r = None if ranks[0] is None else ranks[0] - (0 if u.attrs[1] else 1)
            elif u.op in ("reshape", "expand"):
                r = len(parse_shape(u.attrs[0]))
            elif u.op in _SAME_RANK:
                r = ranks[0]
            else:  # broadcasting elementwise ops and matmul
                r = None if None in ranks else max(ranks)
            self._rank[id(u)] = r
        return self._rank[id(t)]

    def static_shape(self, t: Term) -> tuple[int, ...] | None:
        """The shape of ``t`` when the model has no symbolic dims (the Term language gives those a
        stand-in size, so any shape derived from one would be wrong); None otherwise."""
        if self._shapes is None:
            meta = self.program.leaf_meta()
            names = [i.name for i in self.src.model.graph.input] + list(meta)
            types = [self.src.types.get(n) for n in names]
            static = all(vt is not None and vt.shape is not None and
                         all(isinstance(d, int) for d in vt.shape) for vt in types)
            self._shapes = {k: v[0] for k, v in shapes(self.program.roots(), meta).items()} \
                if static else {}
        if not self._shapes:
            return None
        if id(t) not in self._shapes:
            meta = self.program.leaf_meta()
            self._shapes.update({k: v[0] for k, v in shapes([t], meta).items()})
        return self._shapes[id(t)]

    def source(self, t: Term) -> str:
        """What a term's value depends on: "const" (scalars only), "param" (parameters and
        scalars) or "run" (inputs or opaque values)."""
        stack = [t]
        while stack:  # iterative, and stopping at terms already known: models are deep
            u = stack.pop()
            if id(u) in self._source:
                continue
            pending = [a for a in u.args if id(a) not in self._source]
            if pending:
                stack += [u, *pending]
                continue
            if OPS[u.op].is_leaf:
                kind = u.op if u.op in ("const", "param") else "run"
            else:
                kinds = {self._source[id(a)] for a in u.args}
                kind = "run" if "run" in kinds else "param" if "param" in kinds else "const"
            self._source[id(u)] = kind
        return self._source[id(t)]

    def fold_params(self, t: Term) -> str | None:
        """An initializer holding ``t`` when it reads parameters and constants only and is no larger
        than the parameters it reads; None when it must be computed at run time."""
        if self.source(t) != "param":
            return None
        params = {u.attrs[0]: u for u in postorder([t]) if u.op == "param"}
        if any(u.attrs[2] in _NO_NUMPY or u.attrs[0] not in self.program.params
               for u in params.values()):
            return None
        env = {n: self.program.params[n] for n in params}
        value = evaluate([t], env)[0]
        if not isinstance(value, torch.Tensor) or value.dtype == torch.bfloat16 or \
                value.numel() > sum(v.numel() for v in env.values()):
            return None
        return self.tensor(value.detach().numpy(), "folded")

    # --- emission ---
    def value(self, t: Term, like: Term | None = None) -> str:
        """The value name of an emitted term; constants take the element type of ``like``."""
        if t.op == "const":
            return self.scalar(t.attrs[0], self.dtype(like) if like is not None else None)
        return self.names[id(t)]

    def emit(self, t: Term, out: str | None):
        spec = OPS[t.op]
        if t.op in ("input", "param", "opaque"):
            self.names[id(t)] = t.attrs[0]
            if t.op == "param":
                self.initializers[t.attrs[0]] = self._param(t.attrs[0])
            return
        if t.op == "const" or spec.is_leaf:
            return
        if self.source(t) == "const":
            folded = Term.const(evaluate([t], {})[0])
            self.names[id(t)] = self.value(folded, None)
            return
        emit = None if t.op in NO_ONNX_FORM else EMIT.get(t.op)
        if emit is None:
            raise OnnxExportError(f"op {t.op!r} has no ONNX form")
        name = self.fold_params(t) or emit(self, t, *t.attrs)
        if out is not None and name != out:  # a graph output: its last node writes it directly
            if self.nodes and self.nodes[-1].output[0] == name:
                self.nodes[-1].output[0] = out
            else:
                self.nodes.append(helper.make_node("Identity", [name], [out], name=self.fresh("id")))
            name = out
        self.names[id(t)] = name

    def _param(self, name: str) -> onnx.TensorProto:
        if name in self.src.tensors:
            return self.src.tensors[name]
        return numpy_helper.from_array(self.program.params[name].numpy(), name)

    def copy_opaque(self, key: str):
        call = self.program.opaque[key]
        node = onnx.NodeProto()
        node.CopyFrom(call.target)
        for i, arg in enumerate(call.args):
            if arg is not None:
                node.input[i] = self.value(arg)
        for name, term in call.kwargs.get("captured", ()):
            if self.value(term) != name:  # a subgraph reads this outer name: keep it defined
                self.nodes.append(helper.make_node("Identity", [self.value(term)], [name],
                                                   name=self.fresh("captured")))
        self.nodes.append(node)


def _args(em: Emitter, t: Term) -> list[str]:
    """Operand names; a constant operand takes the element type of its tensor sibling."""
    tensors = [a for a in t.args if a.op != "const"]
    return [em.value(a, tensors[-1] if tensors else None) for a in t.args]


def _simple(em, t, *attrs):
    return em.node(SIMPLE[t.op], _args(em, t), t.op)


def _reduce(em, t, axis, keep):
    op, since = REDUCE[t.op]
    x = em.value(t.args[0])
    if em.opset >= since:
        return em.node(op, [x, em.ints([axis], "axes")], t.op, keepdims=int(keep))
    return em.node(op, [x], t.op, axes=[axis], keepdims=int(keep))


def _var(em, t, axis, keep, correction):
    if correction:
        raise OnnxExportError("var with a correction needs the axis size, which export lacks")
    x = t.args[0]
    centered = Term("sub", (x, Term("mean", (x,), (axis, True))))
    return _emit_tree(em, Term("mean", (Term("mul", (centered, centered)),), (axis, keep)))


def _emit_tree(em: Emitter, root: Term) -> str:
    """Emit a decomposition built from Terms (its leaves are already emitted)."""
    for u in postorder([root]):
        if id(u) not in em.names:
            em.emit(u, None)
    return em.value(root)


def _perm(em, t, rank_of: Term) -> list[int]:
    rank = em.rank(rank_of)
    if rank is None:
        raise OnnxExportError(f"{t.op} of a value of unknown rank")
    return list(range(rank))


def _transpose(em, t, d0, d1):
    perm = _perm(em, t, t.args[0])
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return em.node("Transpose", [em.value(t.args[0])], "transpose", perm=perm)


def _layer_norm(em, t, eps):
    if em.opset >= 17:
        return em.node("LayerNormalization", _args(em, t), "layer_norm", axis=-1, epsilon=eps)
    x, w, b = t.args
    centered = Term("sub", (x, Term("mean", (x,), (-1, True))))
    var = Term("mean", (Term("mul", (centered, centered)),), (-1, True))
    norm = Term("div", (centered, Term("sqrt", (Term("add", (var, Term.const(eps))),))))
    return _emit_tree(em, Term("add", (Term("mul", (norm, w)), b)))


def _gelu(em, t, approximate):
    if em.opset >= 20:
        return em.node("Gelu", [em.value(t.args[0])], "gelu", approximate=approximate)
    x, c = t.args[0], Term.const
    if approximate == "tanh":
        inner = Term("mul", (c(math.sqrt(2 / math.pi)),
                             Term("add", (x, Term("mul", (c(0.044715), Term("pow", (x, c(3.0)))))))))
        gate = Term("tanh", (inner,))
    else:  # the spelling onnxruntime's Gelu fusion recognizes
        gate = Term("erf", (Term("div", (x, c(math.sqrt(2)))),))
    return _emit_tree(em, Term("mul", (Term("mul", (x, Term("add", (gate, c(1.0))))), c(0.5))))


def _sdpa(em, t, scale, causal):
    q, k, v = t.args
    if em.opset >= 23 and em.rank(q) == 4:
        return em.node("Attention", _args(em, t), "attention", scale=scale, is_causal=int(causal))
    if causal:
        raise OnnxExportError(f"causal attention needs the Attention operator (opset 23), "
                              f"the model has opset {em.opset}")
    scores = Term("matmul", (q, Term("transpose", (k,), (-2, -1))))
    scores = scores if scale == 1.0 else Term("mul", (scores, Term.const(scale)))
    return _emit_tree(em, Term("matmul", (Term("softmax", (scores,), (-1,)), v)))


def _linear(em, t):
    x, w, b = t.args
    if em.rank(x) == 2:
        return em.node("Gemm", _args(em, t), "linear", transB=1)
    return _emit_tree(em, Term("add", (Term("matmul", (x, Term("transpose", (w,), (-2, -1)))), b)))


def _concat(em, t, axis):
    parts, stack = [], [t]
    while stack:  # a chain of binary concats on one axis is one Concat
        u = stack.pop()
        if u.op == "concat" and u.attrs[0] == axis and (u is t or id(u) not in em.names):
            stack.extend(reversed(u.args))
        else:
            parts.append(em.value(u))
    return em.node("Concat", parts, "concat", axis=axis)


def _composite(build):
    """An op with no ONNX operator: emitted as its definition in ops that have one."""
    return lambda em, t, *attrs: _emit_tree(em, build(*t.args))


EMIT = {
    **dict.fromkeys(SIMPLE, _simple), **dict.fromkeys(REDUCE, _reduce), "var": _var,
    "log1p": _composite(lambda x: Term("log", (Term("add", (x, Term.const(1.0))),))),
    "expm1": _composite(lambda x: Term("sub", (Term("exp", (x,)), Term.const(1.0)))),
    "rsqrt": _composite(lambda x: Term("div", (Term.const(1.0), Term("sqrt", (x,))))),
    "gelu": _gelu, "transpose": _transpose, "layer_norm": _layer_norm, "sdpa": _sdpa,
    "linear": _linear, "concat": _concat,
    "permute": lambda em, t, perm: em.node("Transpose", [em.value(t.args[0])], "permute",
                                           perm=list(parse_shape(perm))),
    "reshape": lambda em, t, shape: em.node("Reshape", [em.value(t.args[0]), em.ints(parse_shape(shape))],
                                            "reshape"),
    "expand": lambda em, t, shape: em.node("Expand", [em.value(t.args[0]), em.ints(parse_shape(shape))],
                                           "expand"),
    "gather": lambda em, t, axis: em.node("GatherElements", _args(em, t), "gather", axis=axis),
    "index_select": lambda em, t, axis: em.node("Gather", _args(em, t), "index_select", axis=axis),
    "slice": lambda em, t, axis, start, end, step: em.node(
        "Slice", [em.value(t.args[0]), em.ints([start]), em.ints([end]), em.ints([axis]),
                  em.ints([step])], "slice"),
    "cast": lambda em, t, dtype: em.node("Cast", [em.value(t.args[0])], "cast", to=ELEM_TYPES[dtype]),
    "softmax": lambda em, t, axis: em.node("Softmax", [em.value(t.args[0])], "softmax", axis=axis),
    "log_softmax": lambda em, t, axis: em.node("LogSoftmax", [em.value(t.args[0])], "log_softmax",
                                               axis=axis),
}


def _schedule(em: Emitter, roots: list[Term]) -> list:
    """Terms and opaque call keys, each after what it uses (iterative: models are deep)."""
    program, order, done = em.program, [], set()

    def deps(item):
        if isinstance(item, Term):
            return [em.producer[item.attrs[0]]] if item.op == "opaque" and item.attrs[0] in em.producer \
                else list(item.args)
        call = program.opaque[item]
        return [x for x in leaves((call.args, call.kwargs)) if isinstance(x, Term)]

    key = lambda item: id(item) if isinstance(item, Term) else item  # noqa: E731
    for root in roots:
        stack = [(root, False)]
        while stack:
            item, ready = stack.pop()
            if key(item) in done:
                continue
            if ready:
                done.add(key(item))
                order.append(item)
                continue
            stack.append((item, True))
            stack.extend((d, False) for d in reversed(deps(item)) if key(d) not in done)
    return order


def export(src: OnnxProgram, program: Program | None = None) -> onnx.ModelProto:
    """The ModelProto of ``program`` (default: the imported one) with ``src``'s interface."""
    program = program or src.program
    em = Emitter(src, program)
    outputs = list(leaves(program.outputs))
    claimed: dict[int, str] = {}
    for term, name in zip(outputs, src.output_names):  # results are computed into output names
        if not OPS[term.op].is_leaf and id(term) not in claimed:
            claimed[id(term)] = name
    for item in _schedule(em, outputs):
        if isinstance(item, Term):
            em.emit(item, claimed.get(id(item)))
        else:
            em.copy_opaque(item)
    for term, name in zip(outputs, src.output_names):
        value = em.value(term, None)
        if value != name:
            em.nodes.append(helper.make_node("Identity", [value], [name], name=em.fresh("output")))
    graph = src.model.graph
    inputs = [i for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    new_graph = helper.make_graph(em.nodes, graph.name, inputs, list(graph.output),
                                  list(em.initializers.values()), doc_string=graph.doc_string)
    model = helper.make_model(new_graph, opset_imports=list(src.model.opset_import),
                              producer_name="egraph-opt", ir_version=src.model.ir_version)
    model.functions.extend(src.model.functions)
    model.metadata_props.extend(src.model.metadata_props)
    model.domain, model.model_version = src.model.domain, src.model.model_version
    return model
