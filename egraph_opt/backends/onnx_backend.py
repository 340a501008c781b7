"""ONNX backend: a Program back into a ModelProto; each op is written by ``onnx_emitters.EMIT``.

Subterms of parameters alone are folded into initializers, as onnxruntime would at load, so a
folding rule (conv + batch norm) leaves no run-time arithmetic. Opaque nodes are copied with their
operands renamed; the interface, opsets and stored parameters come from the import's side tables.
"""
from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from ..frontends.onnx_converters import ELEM_TYPES
from .onnx_emitters import EMIT, NO_ONNX_FORM, OnnxExportError, emit_tree
from .onnx_patterns import (attention_over_heads, heads_merged, kv_grouped, matmuls_unflattened,
                            products_split, split_product)
from ..frontends.onnx_frontend import OnnxProgram, overridable, subgraph_reads
from ..lang.ops import OPS
from ..lang.program import Program, leaves
from ..kernels.torch_ops import TORCH
from ..lang.term import Term, dtype_name, evaluate, infer, postorder, topological

__all__ = ["EMIT", "NO_ONNX_FORM", "Emitter", "OnnxExportError", "export"]
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
        self.names: dict[int, str] = {}  # by id: every term named here is kept alive below
        self.alive: list[Term] = []  # decompositions' terms, so that no id is reused while named
        self.meta = dict(program.meta())  # and the terms decompositions build (kept alive)
        self.leaf_meta = program.leaf_meta()
        self._consts: dict[tuple, str] = {}
        self._static: bool | None = None
        self._source: dict[int, str] = {}
        self._folded: dict[int, str | None] = {}
        self.producer = {out: key for key, call in program.opaque.items() for out in call.target.output}
        #: attention between a split into heads and a merge, written as one Attention (opset 23)
        self.heads = heads_merged(program.roots(), program.meta()) if self.opset >= 23 else {}
        #: grouped-query attention: Attention (opset 23) over k and v before their heads' repeat
        self.grouped = kv_grouped(program.roots(), program.meta()) if self.opset >= 23 else {}
        #: a MatMul between a flattening and its undoing, written over the unflattened operand
        roots = program.roots()
        self.unflattened = matmuls_unflattened(roots, program.meta(), self.heads) \
            if roots and self.static_shape(roots[0]) is not None else {}
        #: a Split of a product by stored weights, written as a product per part
        self.split = products_split(program, program.meta(), self.unflattened) if roots else {}

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

    def _meta(self, t: Term) -> tuple | None:
        """(shape, dtype) of ``t`` by the one shape inference of terms (lang/term.py), extended to
        the terms a decomposition builds; None where it cannot tell (the stand-in sizes the Term
        language gives symbolic dims may disagree where the real ones agree)."""
        if id(t) not in self.meta:
            for u in topological([t], lambda u: () if id(u) in self.meta else u.args, id):
                operands = [a.attrs[0] if a.op == "const" else self.meta[id(a)] for a in u.args]
                try:
                    found = None if None in operands else infer(u.op, u.attrs, operands, self.leaf_meta)
                except (RuntimeError, TypeError, ValueError, IndexError, KeyError):
                    found = None
                self.meta[id(u)] = found
        return self.meta[id(t)]

    def dtype(self, t: Term) -> str | None:
        """Element type of a term (None for a constant: it takes its tensor operand's)."""
        found = self._meta(t) if t.op != "const" else None
        return dtype_name(found[1]) if found else None

    def rank(self, t: Term) -> int | None:
        found = self._meta(t)
        return None if found is None else len(found[0])

    def static_shape(self, t: Term) -> tuple[int, ...] | None:
        """The shape of ``t`` when the model has no symbolic dims (the Term language gives those a
        stand-in size, so any shape derived from one would be wrong); None otherwise."""
        if self._static is None:
            used = {u.attrs[0] for u in postorder(self.program.roots()) if u.op == "opaque"}
            names = [i.name for i in self.src.model.graph.input] + \
                [n for n in self.leaf_meta if n in used]  # not a template's stale leaves
            types = [self.src.types.get(n) for n in names]
            self._static = all(vt is not None and vt.shape is not None and
                               all(isinstance(d, int) for d in vt.shape) for vt in types)
        found = self._meta(t) if self._static else None
        return None if found is None else found[0]

    def source(self, t: Term) -> str:
        """What a term's value depends on: "const" (scalars only), "param" (parameters and
        scalars) or "run" (inputs or opaque values)."""
        for u in topological([t], lambda u: () if id(u) in self._source else u.args, id):
            if id(u) in self._source:
                continue
            kinds = {self._source[id(a)] for a in u.args} or {u.op if u.op in ("const", "param") else "run"}
            self._source[id(u)] = "run" if "run" in kinds else "param" if "param" in kinds else "const"
        return self._source[id(t)]

    def fold_params(self, t: Term) -> str | None:
        """An initializer holding ``t`` when it reads parameters and constants only and is no larger
        than the parameters it reads; None when it must be computed at run time."""
        if id(t) in self._folded:
            return self._folded[id(t)]
        self._folded[id(t)] = None
        if self.source(t) != "param":
            return None
        params = {u.attrs[0]: u for u in postorder([t]) if u.op == "param"}
        if any(u.attrs[2] in _NO_NUMPY or u.attrs[0] not in self.program.params for u in params.values()):
            return None
        env = {n: self.program.params[n] for n in params}
        value = evaluate([t], env, kernels=TORCH)[0]
        if isinstance(value, torch.Tensor) and value.dtype != torch.bfloat16 and \
                value.numel() <= sum(v.numel() for v in env.values()):
            self._folded[id(t)] = self.tensor(value.detach().numpy(), "folded")
        return self._folded[id(t)]

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
                name = t.attrs[0]
                self.initializers[name] = self.src.tensors[name] if name in self.src.tensors else \
                    numpy_helper.from_array(self.program.params[name].numpy(), name)
            return
        if t.op == "const" or spec.is_leaf:
            return
        if self.source(t) == "const":
            self.names[id(t)] = self.value(Term.const(evaluate([t], {}, kernels=TORCH)[0]), None)
            return
        emit = None if t.op in NO_ONNX_FORM else EMIT.get(spec.onnx)
        if emit is None:
            raise OnnxExportError(f"op {t.op!r} has no ONNX form")
        if id(t) in self.heads:
            name = attention_over_heads(self, *self.heads[id(t)])
        elif id(t) in self.unflattened:
            name = emit_tree(self, self.unflattened[id(t)][0])
        else:
            name = self.fold_params(t) or emit(self, t, *t.attrs)
        if out is not None and name != out:  # a graph output: its last node writes it directly
            if self.nodes and self.nodes[-1].output[0] == name:
                self.nodes[-1].output[0] = out
            else:
                self.nodes.append(helper.make_node("Identity", [name], [out], name=self.fresh("id")))
            name = out
        self.names[id(t)] = name

    def copy_opaque(self, key: str):
        if key in self.split:
            return split_product(self, key, *self.split[key])
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


def _schedule(em: Emitter, roots: list[Term]) -> list:
    """Terms and opaque call keys, each after what it uses (iterative: models are deep)."""
    program = em.program

    def deps(item):
        if isinstance(item, Term) and not OPS[item.op].is_leaf and em.fold_params(item):
            return []  # a folded initializer reads nothing
        if isinstance(item, Term) and id(item) in em.heads:
            attention, *xs, _, _ = em.heads[id(item)]
            return xs + list(attention.args[3:])
        if isinstance(item, Term) and id(item) in em.unflattened:
            return em.unflattened[id(item)][1]
        if isinstance(item, Term) and id(item) in em.grouped:
            return [item.args[0], *em.grouped[id(item)], *item.args[3:]]
        if isinstance(item, Term):
            return [em.producer[item.attrs[0]]] if item.op == "opaque" and item.attrs[0] in em.producer \
                else list(item.args)
        if item in em.split:
            return [em.split[item][0]]  # x: the weights are written as their blocks
        call = program.opaque[item]
        return [x for x in leaves((call.args, call.kwargs)) if isinstance(x, Term)]

    return topological(roots, deps, lambda item: id(item) if isinstance(item, Term) else item)


def _unfused_residuals(nodes: list[onnx.NodeProto]) -> None:
    """An Add that only LayerNormalization reads is written as Sum, the same single addition:
    onnxruntime's CPU provider fuses Add + LayerNormalization into its SkipLayerNormalization, which
    runs slower than the two nodes it replaces (bench/onnx_zoo.py's last section prints both), and
    it matches Add only."""
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in nodes:
        for i, x in enumerate(n.input):
            readers.setdefault(x, []).append((n, i))
        for x in subgraph_reads(n):
            readers.setdefault(x, []).append((n, -1))
    for n in nodes:
        users = readers.get(n.output[0], []) if n.op_type == "Add" and not n.domain else []
        if users and all(u.op_type == "LayerNormalization" and i == 0 for u, i in users):
            n.op_type = "Sum"


def _read_nodes(nodes: list, outputs: list[str]) -> tuple[list, set[str]]:
    """The nodes an output reads, through others (an operand an emitter wrote and then did without,
    the Not of a Where whose branches it swapped, is dropped), and the names they and outputs read."""
    while True:
        read = {x for n in nodes for x in list(n.input) + subgraph_reads(n)} | set(outputs)
        kept = [n for n in nodes if any(o in read for o in n.output if o)]
        if len(kept) == len(nodes):
            return kept, read
        nodes = kept


def export(src: OnnxProgram, program: Program | None = None) -> onnx.ModelProto:
    """The ModelProto of ``program`` (default: the imported one) with ``src``'s interface."""
    program = program or src.program
    em = Emitter(src, program)
    outputs = list(leaves(program.outputs))
    claimed = {id(term): name for term, name in reversed(list(zip(outputs, src.output_names)))
               if not OPS[term.op].is_leaf}  # results are computed into output names (the first one's)
    for item in _schedule(em, outputs):
        if isinstance(item, Term):
            em.emit(item, claimed.get(id(item)))
        else:
            em.copy_opaque(item)
    for term, name in zip(outputs, src.output_names):
        value = em.value(term, None)
        if value != name:
            em.nodes.append(helper.make_node("Identity", [value], [name], name=em.fresh("output")))
    _unfused_residuals(em.nodes)
    em.nodes[:], read = _read_nodes(em.nodes, src.output_names)
    graph = src.model.graph
    defaults = overridable(graph)  # inputs still (every input is kept), their initializers the defaults
    initializers = [t for t in graph.initializer if t.name in defaults] + \
        [t for name, t in em.initializers.items() if name in read]  # folded ones' sources
    new_graph = helper.make_graph(em.nodes, graph.name, list(graph.input), list(graph.output), initializers,
                                  doc_string=graph.doc_string)
    model = helper.make_model(new_graph, opset_imports=list(src.model.opset_import),
                              producer_name="egraph-opt", ir_version=src.model.ir_version)
    model.functions.extend(src.model.functions)
    model.metadata_props.extend(src.model.metadata_props)
    model.domain, model.model_version = src.model.domain, src.model.model_version
    model.doc_string = src.model.doc_string
    return model
