"""ONNX frontend: a ModelProto into a Program of Terms, the same language the torch path lowers to.

Graph inputs become ``input`` terms, initializers and tensor constants ``param`` terms, size-one
numeric constants beside a tensor ``const`` terms. Subgraphs of constants (shape arithmetic,
masks) are folded when every input is known, which needs static input shapes. Nodes the Term
language cannot express exactly (an unknown op, a Reshape whose result is not static) stay opaque
and are copied verbatim by the backend. What the Term language does not keep (symbolic dims,
exact tensor protos, opsets, names) lives in the side tables of ``OnnxProgram``.
"""
from __future__ import annotations

import heapq
import os
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from google.protobuf.message import DecodeError
from onnx import external_data_helper, numpy_helper, shape_inference

from .ops import shape_attr
from .program import OpaqueCall, Program
from .term import Term

MIN_OPSET = 13
#: ONNX element types the Term language names, as torch dtype names
DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64",
          onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16",
          onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32",
          onnx.TensorProto.INT16: "int16", onnx.TensorProto.INT8: "int8",
          onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.BOOL: "bool"}
ELEM_TYPES = {name: code for code, name in DTYPES.items()}
_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                     "Multinomial", "Bernoulli", "Dropout"}
_FOLD_LIMIT = 1 << 16  # elements: larger constant results stay computed at run time


class OnnxImportError(ValueError):
    """A model that cannot be read: the message names what is wrong and where, on one line."""


class Unsupported(Exception):
    """This node, with these operands, has no exact Term: it stays opaque."""


@dataclass(frozen=True)
class ValueType:
    elem_type: int
    shape: tuple | None  # per dim: int, dim_param name, or None; None when the rank is unknown


#: the size a symbolic dim takes inside the Term language (shape analysis, costs); never 1, so no
#: broadcasting or size-one rule can specialize on it; export restores the symbolic dims
SYMBOLIC_SIZE = 2


@dataclass(frozen=True)
class GraphProgram(Program):
    """A Program whose opaque leaves are ONNX values (a node may have several outputs)."""
    value_meta: dict = field(default_factory=dict)  # opaque value name -> (shape, torch dtype)

    def leaf_meta(self) -> dict[str, tuple]:
        return dict(self.value_meta)


@dataclass
class OnnxProgram:
    """A Program plus what ONNX needs back: value types (symbolic dims), tensors, names, opsets."""
    program: Program
    model: onnx.ModelProto  # the original: opsets, metadata, functions, opaque nodes' context
    types: dict[str, ValueType]
    tensors: dict[str, onnx.TensorProto]  # param name -> tensor as stored (exact dtype)
    output_names: tuple[str, ...]
    source: str = "<model>"
    folded: int = 0  # nodes folded into constants

    @property
    def opset(self) -> int:
        return opset_of(self.model)


def opset_of(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def load(path: str | os.PathLike) -> onnx.ModelProto:
    """Read a model and its external data, refusing data files outside the model's directory."""
    path = os.fspath(path)
    try:
        model = onnx.load(path, load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError) as e:
        raise OnnxImportError(f"{path}: not a readable ONNX model (truncated or corrupt): "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except OSError as e:
        raise OnnxImportError(f"{path}: cannot read: {e.strerror or e}") from None
    if not model.HasField("graph") or model.ir_version == 0:
        raise OnnxImportError(f"{path}: not an ONNX model (no graph or IR version)")
    base = os.path.dirname(os.path.abspath(path))
    for tensor in external_data_helper._get_all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = os.path.realpath(os.path.join(base, location))
        if os.path.commonpath([target, os.path.realpath(base)]) != os.path.realpath(base):
            raise OnnxImportError(f"{path}: tensor {tensor.name!r} points to external data "
                                  f"{location!r} outside the model's directory")
        if not os.path.isfile(target):
            raise OnnxImportError(f"{path}: tensor {tensor.name!r}: external data file "
                                  f"{location!r} not found")
    try:
        external_data_helper.load_external_data_for_model(model, base)
    except (OSError, ValueError) as e:
        raise OnnxImportError(f"{path}: cannot read external data: {e}") from None
    return model


def topological(graph: onnx.GraphProto, where: str) -> list[onnx.NodeProto]:
    """Nodes with producers first; a cycle or an undefined input is an error naming the node."""
    known = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output if out}
    deps = []
    for i, node in enumerate(graph.node):
        mine = set()
        for name in node.input:
            if name and name not in known and name not in producer:
                raise OnnxImportError(f"{where}: node {node.name or node.op_type!r} ({node.op_type}) "
                                      f"reads {name!r}, which no node, initializer or input defines")
            if name in producer and name not in known:
                mine.add(producer[name])
        deps.append(mine)
    users: dict[int, list[int]] = {}
    for i, mine in enumerate(deps):
        for d in mine:
            users.setdefault(d, []).append(i)
    waiting = [len(d) for d in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:  # smallest index first: a sorted graph keeps its order
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, []):
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, u)
    if len(order) != len(graph.node):
        stuck = [graph.node[i].name or graph.node[i].op_type for i, w in enumerate(waiting) if w][:4]
        raise OnnxImportError(f"{where}: graph has a cycle through nodes {', '.join(stuck)}")
    return [graph.node[i] for i in order]


def _value_type(info: onnx.ValueInfoProto) -> ValueType | None:
    if not info.type.HasField("tensor_type"):
        return None
    tt = info.type.tensor_type
    if not tt.HasField("shape"):
        return ValueType(tt.elem_type, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in tt.shape.dim)
    return ValueType(tt.elem_type, dims)


def _subgraph_reads(node: onnx.NodeProto) -> list[str]:
    """Outer-scope names that a node's subgraphs (If, Loop, Scan bodies) read."""
    reads: list[str] = []
    for attr in node.attribute:
        for g in list(attr.g.node and [attr.g] or []) + list(attr.graphs):
            defined = {v.name for v in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                reads += [x for x in list(n.input) + _subgraph_reads(n) if x and x not in defined]
                defined.update(n.output)
    return list(dict.fromkeys(reads))


@dataclass
class Importer:
    """State of one import; the converters of ``onnx_ops`` read values through it."""
    model: onnx.ModelProto
    where: str
    types: dict[str, ValueType] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    protos: dict[str, onnx.TensorProto] = field(default_factory=dict)
    terms: dict[str, Term] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    params: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def opset(self) -> int:
        return opset_of(self.model)

    # --- what converters ask ---
    def term(self, name: str) -> Term:
        """The tensor value ``name`` as a Term (constants become ``param`` terms on first use)."""
        if name in self.terms:
            return self.terms[name]
        if name not in self.consts:
            raise Unsupported(f"{name!r} is not a tensor of the Term language")
        array = self.consts[name]
        proto = self.protos.get(name) or numpy_helper.from_array(array, name)
        self.protos[name] = proto
        dtype = DTYPES.get(proto.data_type)
        if dtype is None:
            raise Unsupported(f"constant {name!r} has an element type the Term language lacks")
        if array.dtype.kind in "fiub":
            self.params[name] = torch.from_numpy(np.ascontiguousarray(array).copy())
        self.terms[name] = Term("param", (), (name, shape_attr(array.shape), dtype))
        return self.terms[name]

    def operand(self, name: str, other: str) -> Term:
        """An elementwise operand: a numeric size-one constant that broadcasts away is a const."""
        array = self.consts.get(name)
        if array is not None and array.size == 1 and array.dtype.kind in "fiu" \
                and array.ndim <= self.rank(other):
            return Term.const(float(array.reshape(())))
        return self.term(name)

    def const(self, name: str) -> np.ndarray:
        if name not in self.consts:
            raise Unsupported(f"{name!r} is not a constant")
        return self.consts[name]

    def shape(self, name: str) -> tuple:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        t = self.types.get(name)
        if t is None or t.shape is None:
            raise Unsupported(f"rank of {name!r} unknown")
        return t.shape

    def rank(self, name: str) -> int:
        return len(self.shape(name))

    def static(self, name: str) -> tuple[int, ...]:
        dims = self.shape(name)
        if not all(isinstance(d, int) for d in dims):
            raise Unsupported(f"shape of {name!r} is not static")
        return dims

    def dtype(self, name: str) -> str:
        if name in self.consts:
            return DTYPES.get(onnx.helper.np_dtype_to_tensor_dtype(self.consts[name].dtype), "")
        t = self.types.get(name)
        return DTYPES.get(t.elem_type, "") if t else ""

    def axis(self, name: str, axis: int) -> int:
        """Canonical axis: negative, counted from the end, as the torch lowering writes it."""
        r = self.rank(name)
        if not -r <= axis < max(r, 1):
            raise Unsupported(f"axis {axis} out of range for rank {r}")
        return axis - r if axis >= 0 else axis


# --- converters: one entry per ONNX op type; anything inexact raises Unsupported (opaque) ---

def _attr(node: onnx.NodeProto, name: str, default=None):
    a = next((a for a in node.attribute if a.name == name), None)
    value = default if a is None else onnx.helper.get_attribute_value(a)
    return value.decode() if isinstance(value, bytes) else value


def _floating(im: Importer, name: str) -> bool:
    return im.dtype(name).startswith(("float", "bfloat"))


def _binary(op: str, floating_only: bool = False):
    def convert(im: Importer, node):
        if floating_only and not _floating(im, node.output[0] if node.output[0] in im.types
                                           else node.input[0]):
            raise Unsupported(f"{node.op_type} on integers")
        names = list(node.input)
        out = im.operand(names[0], names[1] if len(names) > 1 else names[0])
        for name in names[1:]:
            out = Term(op, (out, im.operand(name, names[0])))
        return out
    return convert


def _unary(op: str):
    return lambda im, node: Term(op, (im.term(node.input[0]),))


def _reduce(op: str, axes_input_since: int):
    def convert(im: Importer, node):
        x = node.input[0]
        keep = bool(_attr(node, "keepdims", 1))
        if im.opset >= axes_input_since:
            axes = list(im.const(node.input[1])) if len(node.input) > 1 and node.input[1] else []
        else:
            axes = list(_attr(node, "axes", []))
        rank = im.rank(x)
        if not axes:
            if _attr(node, "noop_with_empty_axes", 0):
                return im.term(x)
            axes = list(range(rank))
        out, current = im.term(x), rank
        for p in sorted({int(a) % rank for a in axes}, reverse=True):
            out = Term(op, (out,), (p - current, keep))
            current -= 0 if keep else 1
        return out
    return convert


def _gemm(im: Importer, node):
    a, b = im.term(node.input[0]), im.term(node.input[1])
    alpha, beta = _attr(node, "alpha", 1.0), _attr(node, "beta", 1.0)
    has_c = len(node.input) > 2 and node.input[2]
    if _attr(node, "transA", 0):
        a = Term("transpose", (a,), (-2, -1))
    if _attr(node, "transB", 0) and alpha == 1.0 and beta == 1.0 and has_c:
        return Term("linear", (a, b, im.term(node.input[2])))
    if _attr(node, "transB", 0):
        b = Term("transpose", (b,), (-2, -1))
    out = Term("matmul", (a, b))
    out = out if alpha == 1.0 else Term("mul", (out, Term.const(alpha)))
    if not has_c:
        return out
    c = im.term(node.input[2])
    return Term("add", (out, c if beta == 1.0 else Term("mul", (c, Term.const(beta)))))


def _transpose(im: Importer, node):
    rank = im.rank(node.input[0])
    perm = tuple(_attr(node, "perm", list(range(rank))[::-1]))
    x = im.term(node.input[0])
    if perm == tuple(range(rank)):
        return x
    if rank >= 2 and perm == tuple(range(rank - 2)) + (rank - 1, rank - 2):
        return Term("transpose", (x,), (-2, -1))
    return Term("permute", (x,), (shape_attr(perm),))


def _reshape(im: Importer, node):
    """Reshape, Flatten, Squeeze, Unsqueeze: a reshape to the inferred shape, when it is static."""
    out = im.static(node.output[0])
    x = im.term(node.input[0])
    return x if im.shape(node.input[0]) == out else Term("reshape", (x,), (shape_attr(out),))


def _expand(im: Importer, node):
    out = im.static(node.output[0])
    x = im.term(node.input[0])
    return x if im.shape(node.input[0]) == out else Term("expand", (x,), (shape_attr(out),))


def _gather(im: Importer, node):
    if im.rank(node.input[1]) != 1:
        raise Unsupported("Gather with indices of rank other than 1")
    data = node.input[0]
    return Term("index_select", (im.term(data), im.term(node.input[1])),
                (im.axis(data, _attr(node, "axis", 0)),))


def _gather_elements(im: Importer, node):
    data = node.input[0]
    return Term("gather", (im.term(data), im.term(node.input[1])),
                (im.axis(data, _attr(node, "axis", 0)),))


def _concat(im: Importer, node):
    names = [x for x in node.input if x]
    axis = im.axis(names[0], _attr(node, "axis"))
    out = im.term(names[0])
    for name in names[1:]:
        out = Term("concat", (out, im.term(name)), (axis,))
    return out


def _slice(im: Importer, node):
    x = node.input[0]
    starts, ends = im.const(node.input[1]), im.const(node.input[2])
    rank, dims = im.rank(x), im.shape(x)
    axes = im.const(node.input[3]) if len(node.input) > 3 and node.input[3] else range(len(starts))
    steps = im.const(node.input[4]) if len(node.input) > 4 and node.input[4] else [1] * len(starts)
    out = im.term(x)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        size = dims[int(axis) % rank]
        if step <= 0 or not isinstance(size, int):
            raise Unsupported("Slice with a non-positive step or a dynamic axis")
        bounds = slice(int(start), int(end), int(step)).indices(size)
        if bounds != (0, size, 1):
            out = Term("slice", (out,), (int(axis) % rank - rank, *bounds))
    return out


def _cast(im: Importer, node):
    dtype = DTYPES.get(_attr(node, "to"))
    if dtype is None:
        raise Unsupported("Cast to a type the Term language lacks")
    x = im.term(node.input[0])
    return x if im.dtype(node.input[0]) == dtype else Term("cast", (x,), (dtype,))


def _softmax(op: str):
    return lambda im, node: Term(op, (im.term(node.input[0]),),
                                 (im.axis(node.input[0], _attr(node, "axis", -1)),))


def _layer_norm(im: Importer, node):
    if len(node.input) < 3 or not node.input[2] or im.axis(node.input[0], _attr(node, "axis", -1)) != -1:
        raise Unsupported("LayerNormalization without bias or over several axes")
    x, w, b = (im.term(n) for n in node.input[:3])
    return Term("layer_norm", (x, w, b), (float(_attr(node, "epsilon", 1e-5)),))


def _dropout(im: Importer, node):
    """Inference dropout is the identity (its mask output must stay unused)."""
    if len(node.input) > 2 and node.input[2] and bool(im.const(node.input[2])):
        raise Unsupported("Dropout in training mode")
    return im.term(node.input[0])


def _log_sum_exp(im: Importer, node):
    axes = list(im.const(node.input[1]) if im.opset >= 18 and len(node.input) > 1
                else _attr(node, "axes", []))
    if len(axes) != 1:
        raise Unsupported("ReduceLogSumExp over several axes")
    return Term("logsumexp", (im.term(node.input[0]),),
                (im.axis(node.input[0], int(axes[0])), bool(_attr(node, "keepdims", 1))))


CONVERTERS = {
    "Add": _binary("add"), "Sub": _binary("sub"), "Mul": _binary("mul"),
    "Div": _binary("div", floating_only=True), "Pow": _binary("pow", floating_only=True),
    "Max": _binary("maximum"), "Min": _binary("minimum"),
    "Where": lambda im, n: Term("where", (im.term(n.input[0]), im.operand(n.input[1], n.input[2]),
                                          im.operand(n.input[2], n.input[1]))),
    **{onnx_op: _unary(op) for onnx_op, op in [
        ("Neg", "neg"), ("Exp", "exp"), ("Log", "log"), ("Sqrt", "sqrt"), ("Abs", "abs"),
        ("Sin", "sin"), ("Cos", "cos"), ("Tanh", "tanh"), ("Sigmoid", "sigmoid"),
        ("Relu", "relu"), ("Erf", "erf")]},
    "Reciprocal": lambda im, n: Term("div", (Term.const(1.0), im.term(n.input[0]))),
    "Gelu": lambda im, n: Term("gelu", (im.term(n.input[0]),), (_attr(n, "approximate", "none"),)),
    "Identity": lambda im, n: im.term(n.input[0]),
    "Dropout": _dropout,
    "ReduceSum": _reduce("sum", 13), "ReduceMean": _reduce("mean", 18),
    "ReduceMax": _reduce("max", 18), "ReduceLogSumExp": _log_sum_exp,
    "MatMul": lambda im, n: Term("matmul", (im.term(n.input[0]), im.term(n.input[1]))),
    "Gemm": _gemm, "Transpose": _transpose,
    **dict.fromkeys(("Reshape", "Flatten", "Squeeze", "Unsqueeze"), _reshape),
    "Expand": _expand, "Gather": _gather, "GatherElements": _gather_elements, "Concat": _concat,
    "Slice": _slice, "Cast": _cast, "Softmax": _softmax("softmax"),
    "LogSoftmax": _softmax("log_softmax"), "LayerNormalization": _layer_norm,
}


def _set_constant(im: Importer, name: str, array: np.ndarray, proto=None):
    im.consts[name] = array
    if proto is not None:
        im.protos[name] = proto


def _constant_node(node: onnx.NodeProto) -> np.ndarray:
    attr = node.attribute[0]
    if attr.name == "value":
        return numpy_helper.to_array(attr.t)
    kind = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
            "value_ints": np.int64}.get(attr.name)
    if kind is None:
        raise Unsupported(f"Constant with {attr.name}")
    return np.array(onnx.helper.get_attribute_value(attr), dtype=kind)


def _fold(im: Importer, node: onnx.NodeProto) -> list[np.ndarray] | None:
    """Outputs of a node whose inputs are all constants, or None when it must run at run time."""
    if node.op_type == "Shape" and node.input[0] in im.types:
        try:
            dims = np.array(im.static(node.input[0]), dtype=np.int64)
        except Unsupported:
            return None
        start = next((a.i for a in node.attribute if a.name == "start"), 0)
        end = next((a.i for a in node.attribute if a.name == "end"), len(dims))
        return [dims[start:end]]
    if node.domain not in ("", "ai.onnx") or node.op_type in _NONDETERMINISTIC or \
            any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return None
    inputs = [x for x in node.input if x]
    if not inputs or not all(x in im.consts for x in inputs):
        return None
    if sum(im.consts[x].size for x in inputs) > _FOLD_LIMIT:
        return None
    from onnx.reference import ReferenceEvaluator
    try:
        results = ReferenceEvaluator(node).run(None, {x: im.consts[x] for x in inputs})
    except Exception:  # noqa: BLE001 - a node the reference cannot fold simply runs at run time
        return None
    if any(np.asarray(r).size > _FOLD_LIMIT for r in results):
        return None
    return [np.asarray(r) for r in results]


def import_model(model: onnx.ModelProto, where: str = "<model>") -> OnnxProgram:
    """The Program of a model, with the side tables its export needs."""
    if opset_of(model) < MIN_OPSET:
        raise OnnxImportError(f"{where}: opset {opset_of(model)} is older than {MIN_OPSET}; "
                              "convert it with onnx.version_converter first")
    graph = model.graph
    nodes = topological(graph, where)
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True).graph
    except Exception:  # noqa: BLE001 - inference is a help; without it more nodes stay opaque
        inferred = graph
    im = Importer(model, where)
    for info in list(inferred.value_info) + list(inferred.output) + list(graph.input):
        vt = _value_type(info)
        if vt is not None:
            im.types[info.name] = vt
    for tensor in graph.initializer:
        _set_constant(im, tensor.name, numpy_helper.to_array(tensor), tensor)
    inputs = []
    for info in graph.input:
        if info.name in im.consts:
            continue
        vt = _value_type(info)
        if vt is None or vt.shape is None:
            raise OnnxImportError(f"{where}: graph input {info.name!r} has no tensor shape "
                                  "(its rank is needed)")
        dims = tuple(d if isinstance(d, int) else SYMBOLIC_SIZE for d in vt.shape)
        im.terms[info.name] = Term.input(info.name, dims, DTYPES.get(vt.elem_type, "float32"))
        inputs.append(im.terms[info.name])
    for node in nodes:
        im.used.update(node.input)
        im.used.update(_subgraph_reads(node))
    im.used.update(o.name for o in graph.output)

    opaque: dict[str, OpaqueCall] = {}
    meta: dict[str, tuple] = {}
    shapeless: set[str] = set()  # opaque values of unknown shape: only opaque nodes may use them
    folded = 0
    for i, node in enumerate(nodes):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            try:
                _set_constant(im, node.output[0], _constant_node(node))
                folded += 1
                continue
            except Unsupported:
                pass
        values = _fold(im, node)
        if values is not None:
            for out, value in zip(node.output, values):
                _set_constant(im, out, value)
            folded += 1
            continue
        converter = CONVERTERS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        try:
            if converter is None:
                raise Unsupported(node.op_type)
            if any(x in shapeless for x in node.input):
                raise Unsupported("an operand's shape is unknown: the Term language needs it")
            results = converter(im, node)
            results = results if isinstance(results, tuple) else (results,)
            if any(out in im.used for out in node.output[len(results):]):
                raise Unsupported("an extra output is used")
            for out, term in zip(node.output, results):
                im.terms[out] = term
        except Unsupported:
            key = _unique(node.name or f"{node.op_type}_{i}", opaque)
            args = tuple(im.term(x) if x else None for x in node.input)
            reads = tuple((x, im.term(x)) for x in _subgraph_reads(node) if x in im.terms or x in im.consts)
            opaque[key] = OpaqueCall(key, "onnx", node, args, {"captured": reads} if reads else {})
            for out in node.output:
                if out:
                    im.terms[out] = Term("opaque", (), (out,))
                    meta[out] = _meta(im, out)
                    if meta[out] is None:  # analyses see a scalar; no Term ever reads it
                        shapeless.add(out)
                        meta[out] = ((), getattr(torch, im.dtype(out) or "float32"))
    outputs = tuple(im.term(o.name) for o in graph.output)
    program = GraphProgram(tuple(inputs), outputs, opaque,
                           {n: t for n, t in im.params.items() if n in im.terms}, meta)
    tensors = {n: im.protos[n] for n, t in im.terms.items() if t.op == "param"}
    for o in graph.output:
        im.types[o.name] = _value_type(o) or im.types.get(o.name)
    return OnnxProgram(program, model, im.types, tensors, tuple(o.name for o in graph.output),
                       where, folded)


def _meta(im: Importer, name: str) -> tuple | None:
    """(shape, torch dtype) of an opaque value, or None where its type is unknown."""
    vt, dtype = im.types.get(name), im.dtype(name)
    if vt is None or vt.shape is None or not dtype:
        return None
    return tuple(d if isinstance(d, int) else SYMBOLIC_SIZE for d in vt.shape), getattr(torch, dtype)


def _unique(name: str, taken) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    return out


def read(path: str | os.PathLike) -> OnnxProgram:
    """Load and import a model file: every problem with it is an ``OnnxImportError``."""
    return import_model(load(path), os.fspath(path))
