"""ONNX frontend: a ModelProto into a Program of Terms (the torch path's language). Constant subgraphs (shape
arithmetic, masks) fold when every input is known. Nodes no Term expresses exactly stay opaque, copied verbatim by
the backend; what Terms drop (symbolic dims, tensor protos, opsets, names) lives in ``OnnxProgram``'s side tables."""
from __future__ import annotations

import contextlib
import heapq
import itertools
import os
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from google.protobuf.message import DecodeError
from onnx import external_data_helper, numpy_helper, shape_inference

from .onnx_converters import CONVERTERS, DTYPES, Importer, Unsupported, ValueType, opset_of
from .onnx_layouts import attr
from ..lang.program import OpaqueCall, Program
from ..lang.term import Term

MIN_OPSET = 13
_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                     "Multinomial", "Bernoulli", "Dropout"}
_FOLD_LIMIT = 1 << 16  # elements: larger constant results stay computed at run time
#: the size a symbolic dim takes inside the Term language (shape analysis, costs); never 1, so no
#: broadcasting or size-one rule can specialize on it; export restores the symbolic dims
SYMBOLIC_SIZE = 2


class OnnxImportError(ValueError):
    """A model that cannot be read: the message names what is wrong and where, on one line."""


@dataclass(frozen=True)
class GraphProgram(Program):
    """A Program whose opaque leaves are ONNX values (a node may have several outputs)."""
    value_meta: dict = field(default_factory=dict)  # opaque value name -> (shape, torch dtype)

    def leaf_meta(self) -> dict[str, tuple]:
        return {**super().leaf_meta(), **self.value_meta}


@dataclass(kw_only=True)
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


def external_files(path: str, model: onnx.ModelProto) -> list[str]:
    """External data files of ``model``, relative to ``path``'s folder; one outside or missing is refused."""
    base, files = os.path.dirname(os.path.abspath(path)), []
    for tensor in external_data_helper._get_all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = os.path.realpath(os.path.join(base, location))
        if os.path.commonpath([target, os.path.realpath(base)]) != os.path.realpath(base):
            raise OnnxImportError(f"{path}: tensor {tensor.name!r} points to external data "
                                  f"{location!r} outside the model's directory")
        if not os.path.isfile(target):
            raise OnnxImportError(f"{path}: tensor {tensor.name!r}: external data file {location!r} not found")
        files.append(location)
    return list(dict.fromkeys(files))


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
    external_files(path, model)
    try:
        external_data_helper.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    except (OSError, ValueError) as e:
        raise OnnxImportError(f"{path}: cannot read external data: {e}") from None
    return model


def nodes_in_order(graph: onnx.GraphProto, where: str) -> list[onnx.NodeProto]:
    """Nodes with producers first; a cycle or an undefined input is an error naming the node."""
    known = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    producer, users, waiting = {out: i for i, n in enumerate(graph.node) for out in n.output if out}, {}, []
    for i, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in known and name not in producer:
                raise OnnxImportError(f"{where}: node {node.name or node.op_type!r} ({node.op_type}) "
                                      f"reads {name!r}, which no node, initializer or input defines")
        mine = {producer[x] for x in node.input if x in producer and x not in known}
        for d in mine:
            users.setdefault(d, []).append(i)
        waiting.append(len(mine))
    ready, order = [i for i, w in enumerate(waiting) if w == 0], []  # ready ascending: already a heap
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
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    return ValueType(tt.elem_type, dims if tt.HasField("shape") else None)


def subgraph_reads(node: onnx.NodeProto) -> list[str]:
    """Outer-scope names that a node's subgraphs (If, Loop, Scan bodies) read."""
    reads: list[str] = []
    for attr in node.attribute:
        for g in list(attr.g.node and [attr.g] or []) + list(attr.graphs):
            defined = {v.name for v in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                reads += [x for x in list(n.input) + subgraph_reads(n) if x and x not in defined]
                defined.update(n.output)
    return list(dict.fromkeys(reads))


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
        with contextlib.suppress(Unsupported):
            dims = np.array(im.static(node.input[0]), dtype=np.int64)
            return [dims[attr(node, "start", 0):attr(node, "end", len(dims))]]
        return None
    if node.domain not in ("", "ai.onnx") or node.op_type in _NONDETERMINISTIC or \
            any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return None
    inputs = [x for x in node.input if x]
    if not inputs or not all(x in im.consts for x in inputs) or sum(im.consts[x].size for x in inputs) > _FOLD_LIMIT:
        return None
    from onnx.reference import ReferenceEvaluator
    with contextlib.suppress(Exception):  # a node the reference cannot fold simply runs at run time
        results = [np.asarray(r) for r in ReferenceEvaluator(node).run(None, {x: im.consts[x] for x in inputs})]
        return None if any(r.size > _FOLD_LIMIT for r in results) else results
    return None


def overridable(graph: onnx.GraphProto) -> set[str]:
    """Initializers also listed as inputs: defaults a feed may override, so never folded into the program."""
    return {i.name for i in graph.input} & {t.name for t in graph.initializer}


def import_model(model: onnx.ModelProto, where: str = "<model>") -> OnnxProgram:
    """The Program of a model, with the side tables its export needs."""
    if opset_of(model) < MIN_OPSET:
        raise OnnxImportError(f"{where}: opset {opset_of(model)} is older than {MIN_OPSET}; "
                              "convert it with onnx.version_converter first")
    graph, nodes = model.graph, nodes_in_order(model.graph, where)
    im, inputs = _importer(model, where, nodes), []
    for info in graph.input:
        if (vt := im.types.get(info.name)) is None or vt.shape is None:
            raise OnnxImportError(f"{where}: graph input {info.name!r} has no tensor shape (its rank is needed)")
        dims = tuple(d if isinstance(d, int) else SYMBOLIC_SIZE for d in vt.shape)
        im.terms[info.name] = Term.input(info.name, dims, DTYPES.get(vt.elem_type, "float32"))
        inputs.append(im.terms[info.name])
    folded, opaque, opaque_types = _convert(im, nodes, all(static_type(im.types.get(i.name)) for i in graph.input))
    program = GraphProgram(tuple(inputs), tuple(im.term(o.name) for o in graph.output), opaque,
                           {n: t for n, t in im.params.items() if n in im.terms}, value_meta=opaque_types)
    tensors = {n: im.protos[n] for n, t in im.terms.items() if t.op == "param"}
    im.types.update((o.name, _value_type(o) or im.types.get(o.name)) for o in graph.output)
    return OnnxProgram(program=program, model=model, types=im.types, tensors=tensors,
                       output_names=tuple(o.name for o in graph.output), source=where, folded=folded)


def _importer(model: onnx.ModelProto, where: str, nodes: list[onnx.NodeProto]) -> Importer:
    """An importer knowing every value's inferred type, the constant initializers and which values are read."""
    graph = model.graph
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True).graph
    except Exception:  # noqa: BLE001 - inference is a help; without it more nodes stay opaque
        inferred = graph
    im = Importer(model, where, producers={o: n for n in nodes for o in n.output})
    im.types.update((info.name, vt) for info in [*inferred.value_info, *inferred.output, *graph.input]
                    if (vt := _value_type(info)) is not None)
    defaults = overridable(graph)
    for tensor in graph.initializer:
        if tensor.name not in defaults:  # a caller may feed another value: an input, not a constant
            im.consts[tensor.name], im.protos[tensor.name] = numpy_helper.to_array(tensor), tensor
        elif getattr(im.types.get(tensor.name), "shape", None) is None:  # its default's, if undeclared
            im.types[tensor.name] = ValueType(tensor.data_type, tuple(tensor.dims))
    im.used.update(x for node in nodes for x in [*node.input, *subgraph_reads(node)])
    im.used.update(o.name for o in graph.output)
    return im


def _convert(im: Importer, nodes: list[onnx.NodeProto], static: bool):
    """Fold, convert or keep opaque each node in order: (folded count, opaque calls, their (shape, dtype))."""
    opaque, opaque_types, folded = {}, {}, 0
    shapeless: set[str] = set()  # opaque values of unknown shape: only opaque nodes may use them
    for i, node in enumerate(nodes):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            with contextlib.suppress(Unsupported):  # a Constant we cannot read stays a node
                im.consts[node.output[0]] = _constant_node(node)
                folded += 1
                continue
        if (values := _fold(im, node)) is not None:
            im.consts.update(zip(node.output, values))
            folded += 1
            continue
        if static:
            _exact_types(im, node)
        try:
            _convert_node(im, node, shapeless)
        except Unsupported:  # the node runs as itself: its outputs are opaque leaves of the program
            key = unique(node.name or f"{node.op_type}_{i}", opaque)
            args = tuple(im.term(x) if x else None for x in node.input)
            reads = tuple((x, im.term(x)) for x in subgraph_reads(node) if x in im.terms or x in im.consts)
            opaque[key] = OpaqueCall(key, "onnx", node, args, {"captured": reads} if reads else {})
            for out in filter(None, node.output):
                im.terms[out] = Term("opaque", (), (out,))
                vt, dtype = im.types.get(out), im.dtype(out)
                if vt is None or vt.shape is None or not dtype:  # analyses see a scalar; no Term reads it
                    shapeless.add(out)
                    opaque_types[out] = ((), getattr(torch, dtype or "float32"))
                else:
                    opaque_types[out] = tuple(d if isinstance(d, int) else SYMBOLIC_SIZE for d in vt.shape), \
                        getattr(torch, dtype)
    return folded, opaque, opaque_types


def _convert_node(im: Importer, node: onnx.NodeProto, shapeless: set[str]) -> None:
    converter = CONVERTERS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if converter is None:
        raise Unsupported(node.op_type)
    if any(x in shapeless for x in node.input):
        raise Unsupported("an operand's shape is unknown: the Term language needs it")
    results = converter(im, node)
    results = results if isinstance(results, tuple) else (results,)
    if any(out in im.used for out in node.output[len(results):]):
        raise Unsupported("an extra output is used")
    im.terms.update(zip(node.output, results))


def static_type(vt: ValueType | None) -> bool:
    return vt is not None and vt.shape is not None and all(isinstance(d, int) for d in vt.shape)


def _exact_types(im: Importer, node: onnx.NodeProto) -> None:
    """Output types that whole-graph shape inference left unknown (past a run-time shape, folded since), inferred over
    this node alone: then Reshape and Expand convert, and an opaque node's users see its shape."""
    if all(static_type(im.types.get(o)) for o in node.output if o):
        return
    inputs, values = [], []
    for x in dict.fromkeys(x for x in node.input if x):
        if x in im.consts:
            values.append(im.protos.get(x) or numpy_helper.from_array(im.consts[x], x))
        elif static_type(im.types.get(x)):
            inputs.append(onnx.helper.make_tensor_value_info(x, im.types[x].elem_type, im.types[x].shape))
        else:
            return
    one = onnx.helper.make_model(onnx.helper.make_graph([node], "one", inputs, [], values),
                                 opset_imports=im.model.opset_import, ir_version=im.model.ir_version)
    try:
        inferred = shape_inference.infer_shapes(one, strict_mode=False, data_prop=True).graph
    except Exception:  # noqa: BLE001 - inference is a help, as over the whole graph
        return
    im.types.update((info.name, vt) for info in inferred.value_info
                    if info.name in node.output and static_type(vt := _value_type(info)))


def unique(name: str, taken) -> str:
    """``name``, else the first of ``name_1``, ``name_2``... not in ``taken``."""
    return next(n for n in itertools.chain([name], (f"{name}_{k}" for k in itertools.count(1))) if n not in taken)
