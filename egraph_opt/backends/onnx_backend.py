"""ONNX backend: a Program back into a ModelProto; each op is written by ``onnx_emitters.EMIT``.

Subterms of parameters alone are folded into initializers, as onnxruntime would at load, so a folding rule (conv +
batch norm) leaves no run-time arithmetic. Opaque nodes are copied with their operands renamed; the interface, opsets
and stored parameters come from the import's side tables. Patterns over several terms are written as fewer nodes
(``heads_merged``, ``matmuls_unflattened``, ``products_split``: each finds its cases before emission)."""
from __future__ import annotations

import math
from collections import Counter
from typing import Callable

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from ..frontends.onnx_converters import ELEM_TYPES
from .onnx_emitters import EMIT, NO_ONNX_FORM, OnnxExportError, emit_tree, full_rows
from ..frontends.onnx_frontend import OnnxProgram, overridable, static_type, subgraph_reads, unique
from ..frontends.onnx_layouts import attr, standard
from ..lang.ops import OPS, parse_shape
from ..lang.program import Program, leaves
from ..kernels.torch_ops import TORCH
from ..lang.term import Term, dtype_name, evaluate, infer, postorder, topological

__all__ = ["EMIT", "NO_ONNX_FORM", "Emitter", "OnnxExportError", "export"]
_NO_NUMPY = {"bfloat16"}  # element types whose parameters cannot be folded through numpy


def _uses(roots: list[Term], order: list[Term]) -> Counter:
    """How many terms read each term, a root once more: a pattern may drop a term that only it reads."""
    return Counter(id(a) for t in order for a in t.args) + Counter(id(r) for r in roots)


def _swapped(t: Term) -> Term | None:
    """The operand of a swap of axes 1 and 2 of a rank-4 value (heads and sequence), else None."""
    swap = t.op == "transpose" and sorted(t.attrs) in ([1, 2], [-3, -2])
    return t.args[0] if swap or t.op == "permute" and t.attrs[0] == "0,2,1,3" else None


def _heads_of(t: Term, shapes: dict) -> tuple[tuple[Term, Term | None], int] | None:
    """((x, c), H) when ``t`` is x (batch, seq, H * D) split into H heads: viewed as (batch, seq, H,
    D), then heads and sequence swapped, and scaled by the constant c after the view (or None)."""
    scale = t.args[1] if t.op == "mul" and t.args[1].op == "const" else None
    view = _swapped(t if scale is None else t.args[0])
    if scale is None and view is not None and view.op == "mul" and view.args[1].op == "const":
        view, scale = view.args[0], view.args[1]  # scaled between the view and the swap
    if view is None or view.op != "reshape":
        return None
    x, split, whole = view.args[0], parse_shape(view.attrs[0]), shapes[id(view.args[0])][0]
    return None if len(split) != 4 or len(whole) != 3 or split[:2] != whole[:2] or split[2] * split[3] != whole[2] \
        else ((x, scale), split[2])


def heads_merged(roots: list[Term], shapes: dict) -> dict[int, tuple]:
    """Attention on operands split into heads whose only use merges them back, at opset 23 one Attention over
    the unsplit values: merged term id -> (attention, x of q, k, v, H, reshape target or None)."""
    order = postorder(roots)
    uses, found = _uses(roots, order), {}
    for t in order:
        attention = _swapped(t.args[0]) if t.op == "reshape" else None
        if attention is None or OPS[attention.op].onnx != "Attention" or \
                uses[id(attention)] != 1 or uses[id(t.args[0])] != 1:
            continue
        heads = [_heads_of(a, shapes) for a in attention.args[:3]]
        if None not in heads and len({h for _, h in heads}) == 1:
            (xq, h), (xk, _), (xv, _) = heads
            written = shapes[id(xq[0])][0][:2] + shapes[id(xv[0])][0][2:]  # what Attention writes
            found[id(t)] = (attention, xq, xk, xv, h, None if shapes[id(t)][0] == written else t.attrs[0])
    return found


def attention_over_heads(em, attention: Term, xq: tuple, xk: tuple, xv: tuple, heads: int,
                         reshape_to: str | None) -> str:
    """``xq``, ``xk``, ``xv``: (x, the constant it is scaled by or None), from ``_heads_of``."""
    scale, causal = attention.attrs if attention.op == "sdpa" else (attention.attrs[0], False)
    inputs = [em.value(x) if c is None else em.node("Mul", [em.value(x), em.value(c, x)], "scaled")
              for x, c in (xq, xk, xv)] + [full_rows(em, a, xq[0], xk[0]) for a in attention.args[3:]]
    out = em.node("Attention", inputs, "attention", scale=scale, is_causal=int(causal),
                  q_num_heads=heads, kv_num_heads=heads)
    return out if reshape_to is None else em.node("Reshape", [out, em.ints(parse_shape(reshape_to))], "reshape")


def _product(t: Term, shapes: dict) -> tuple[Term, Callable[[Term], Term]] | None:
    """(a, rebuild) when ``t`` is matmul(a, w), matmul(a, w) +- b (either order) or linear(a, w, b)
    with a bias b of at most one axis (broadcast along the last axis only); rebuild(x): x's product."""
    if t.op == "linear" and len(shapes[id(t.args[2])][0]) <= 1:
        return t.args[0], lambda x: Term("linear", (x, *t.args[1:]))
    if t.op in ("add", "sub"):
        for i, (m, b) in enumerate((t.args, t.args[::-1])):
            found = _product(m, shapes) if m.op == "matmul" and len(shapes[id(b)][0]) <= 1 else None
            if found is not None:
                return found[0], lambda x, i=i, b=b, again=found[1]: Term(
                    t.op, (again(x), b) if i == 0 else (b, again(x)))
    if t.op == "matmul" and len(shapes[id(t.args[1])][0]) == 2:
        return t.args[0], lambda x: Term("matmul", (x, t.args[1]))
    return None


def matmuls_unflattened(roots: list[Term], shapes: dict, heads: dict) -> dict[int, tuple[Term, list[Term]]]:
    """reshape(p(reshape(x, (M, K))), L + (N,)), p a product by a matrix (plus a bias, ``_product``), M the product of L
    and x of shape L + (K,): the flattening exporters write around a 2-D Gemm, which MatMul does not need (it
    broadcasts: the same products in the same order), as p(x): outer reshape id -> (p(x), the program's terms it
    reads). It may be the merge of an attention's heads (``heads``) nothing else reads: its reshape goes (there too)."""
    order = postorder(roots)
    uses, found = _uses(roots, order), {}
    for t in order:
        product = _product(t.args[0], shapes) if t.op == "reshape" and uses[id(t.args[0])] == 1 else None
        flat = product[0] if product else None
        if flat is None or flat.op != "reshape" or len(shapes[id(flat)][0]) != 2:
            continue
        lead, (m, k), (rows, _) = shapes[id(t)][0][:-1], shapes[id(flat)][0], shapes[id(t.args[0])][0]
        if len(lead) < 2 or m != math.prod(lead) or rows != m:
            continue
        x = flat.args[0]
        if shapes[id(x)][0] != lead + (k,):
            x = flat if id(flat) in heads and uses[id(flat)] == 1 and t.args[0].op != "linear" else None
            attention, xq, xk, xv, h, _ = heads[id(flat)] if x is not None else (None,) * 6
            if x is None or shapes[id(xq[0])][0][:2] + shapes[id(xv[0])][0][2:] != lead + (k,):  # Attention's
                continue
            heads[id(flat)] = (attention, xq, xk, xv, h, None)
        new = product[1](x)
        reads, stack = [], [new]
        while stack:  # the program's terms it reads: x, the weight, the bias
            if id(u := stack.pop()) in uses or u is x:
                reads.append(u)
            else:
                stack += u.args
        found[id(t)] = (new, reads)
    return found


def products_split(program, shapes: dict, unflattened: dict) -> dict[str, tuple[Term, Term, Term | None, list[int]]]:
    """Split (ONNX, opaque) along the last axis of x @ w (+ b), w a stored matrix and b a stored vector, that nothing
    else reads: a product per part, by w's (and b's) column block, without Split's copy: key -> (x, w, b, sizes)."""
    roots = program.roots()
    uses, found = _uses(roots, postorder(roots)), {}
    for key, call in program.opaque.items():
        node, outer = call.target, call.args[0] if call.args else None
        if not standard(node, "Split") or not isinstance(outer, Term) or uses[id(outer)] != 1:
            continue
        fresh = id(outer) in unflattened  # made for this export: read once, by the Split
        t, bias = unflattened[id(outer)][0] if fresh else outer, None
        if t.op == "linear" and t.args[1].op == "transpose" and t.args[1].attrs == (-2, -1):  # x @ w + b, fused
            t, bias, fresh = Term("matmul", (t.args[0], t.args[1].args[0])), t.args[2], True
        elif t.op == "add":  # no product among its operands: t stays the add, refused below
            t, bias = next(((m, b) for m, b in (t.args, t.args[::-1]) if m.op == "matmul"), (t, None))
        if t.op != "matmul" or bias is not None and bias.op != "param" or not (fresh or uses[id(t)] == 1) \
                or t.args[1].op != "param":
            continue
        x, w = t.args
        rank, n = len(shapes[id(x)][0]), shapes[id(w)][0]
        if len(n) != 2 or attr(node, "axis", 0) not in (-1, rank - 1) or \
                bias is not None and shapes[id(bias)][0] != n[1:]:  # a bias sliced with w's columns
            continue  # holds one value per column
        sizes = call.args[1] if len(call.args) > 1 else None  # none: equal parts (their sum checked below)
        sizes = [n[1] // len(node.output)] * len(node.output) if sizes is None else \
            [int(v) for v in program.params[sizes.attrs[0]].tolist()] if sizes.op == "param" else None
        if sizes and sum(sizes) == n[1] and len(sizes) == len(node.output) and all(node.output):
            found[key] = (x, w, bias, sizes)
    return found


def split_product(em, key: str, x: Term, w: Term, bias: Term | None, sizes: list[int]) -> None:
    """Each output of the Split as x @ w[:, block] (+ b[block]), under its own name."""
    weight, b = (None if v is None else em.program.params[v.attrs[0]].numpy() for v in (w, bias))
    for out, start, size in zip(em.program.opaque[key].target.output, np.cumsum([0, *sizes]), sizes):
        block = slice(start, start + size)
        matmul = em.node("MatMul", [em.value(x), em.tensor(np.ascontiguousarray(weight[:, block]), "weight")], "matmul")
        if b is not None:
            em.node("Add", [matmul, em.tensor(np.ascontiguousarray(b[block]), "bias")], "add")
        em.nodes[-1].output[0] = out


class Emitter:
    """Builds one graph: Terms to value names, each value emitted once, after what it uses."""

    def __init__(self, src: OnnxProgram, program: Program):
        self.src, self.program, self.opset, graph = src, program, src.opset, src.model.graph
        self.taken = {v.name for v in list(graph.input) + list(graph.output)}
        self.taken |= {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
        self.nodes, self.initializers = [], {}  # NodeProtos; name -> TensorProto
        self.names: dict[int, str] = {}  # by id: every term named here is kept alive below
        self.alive: list[Term] = []  # decompositions' terms, so that no id is reused while named
        self.meta = dict(program.meta())  # and the terms decompositions build (kept alive)
        self.leaf_meta = program.leaf_meta()
        self._consts, self._source, self._folded = {}, {}, {}  # memos of tensor, source and fold_params
        self._static: bool | None = None
        self.producer = {out: key for key, call in program.opaque.items() for out in call.target.output}
        roots, shapes = program.roots(), program.meta()
        #: attention between a split into heads and a merge, written as one Attention (opset 23)
        self.heads = heads_merged(roots, shapes) if self.opset >= 23 else {}
        #: a MatMul between a flattening and its undoing, written over the unflattened operand
        static = roots and self.static_shape(roots[0]) is not None
        self.unflattened = matmuls_unflattened(roots, shapes, self.heads) if static else {}
        #: a Split of a product by stored weights, written as a product per part
        self.split = products_split(program, shapes, self.unflattened) if roots else {}

    def fresh(self, hint: str) -> str:
        name = unique(f"eo_{hint}", self.taken)
        self.taken.add(name)
        return name

    def tensor(self, array: np.ndarray, hint: str) -> str:
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            self._consts[key] = name = self.fresh(hint)
            self.initializers[name] = numpy_helper.from_array(array, name)
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
        """(shape, dtype) of ``t`` by the terms' one shape inference, extended to a decomposition's terms;
        None where it cannot tell (symbolic dims' stand-in sizes may disagree where the real ones agree)."""
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
        return None if (found := self._meta(t)) is None else len(found[0])

    def static_shape(self, t: Term) -> tuple[int, ...] | None:
        """``t``'s shape if the model has no symbolic dims (stand-in sizes give wrong shapes), else None."""
        if self._static is None:
            used = {u.attrs[0] for u in postorder(self.program.roots()) if u.op == "opaque"}
            names = [i.name for i in self.src.model.graph.input] + \
                [n for n in self.leaf_meta if n in used]  # not a template's stale leaves
            self._static = all(static_type(self.src.types.get(n)) for n in names)
        return found[0] if self._static and (found := self._meta(t)) is not None else None

    def source(self, t: Term) -> str:
        """What a term depends on: "const" (scalars), "param" (and parameters) or "run" (inputs, opaque)."""
        for u in topological([t], lambda u: () if id(u) in self._source else u.args, id):
            if id(u) in self._source:
                continue
            kinds = {self._source[id(a)] for a in u.args} or {u.op if u.op in ("const", "param") else "run"}
            self._source[id(u)] = "run" if "run" in kinds else "param" if "param" in kinds else "const"
        return self._source[id(t)]

    def fold_params(self, t: Term) -> str | None:
        """An initializer of ``t`` if it reads parameters and constants only and is no larger than they; else None."""
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
        return self.scalar(t.attrs[0], self.dtype(like) if like is not None else None) if t.op == "const" else \
            self.names[id(t)]

    def emit(self, t: Term, out: str | None):
        spec = OPS[t.op]
        if t.op in ("input", "param", "opaque"):
            name = self.names[id(t)] = t.attrs[0]
            if t.op == "param":
                self.initializers[name] = self.src.tensors[name] if name in self.src.tensors else \
                    numpy_helper.from_array(self.program.params[name].numpy(), name)
            return
        if t.op == "const" or spec.is_leaf:
            return
        if self.source(t) == "const":
            self.names[id(t)] = self.value(Term.const(evaluate([t], {}, kernels=TORCH)[0]), None)
            return
        if (emit := None if t.op in NO_ONNX_FORM else EMIT.get(spec.onnx)) is None:
            raise OnnxExportError(f"op {t.op!r} has no ONNX form")
        name = attention_over_heads(self, *self.heads[id(t)]) if id(t) in self.heads else \
            emit_tree(self, self.unflattened[id(t)][0]) if id(t) in self.unflattened else \
            self.fold_params(t) or emit(self, t, *t.attrs)
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
        call, node = self.program.opaque[key], onnx.NodeProto()
        node.CopyFrom(call.target)
        for i, arg in enumerate(call.args):
            if arg is not None:
                node.input[i] = self.value(arg)
        for name, term in call.kwargs.get("captured", ()):
            if self.value(term) != name:  # a subgraph reads this outer name: keep it defined
                self.nodes.append(helper.make_node("Identity", [self.value(term)], [name], name=self.fresh("captured")))
        self.nodes.append(node)


def _schedule(em: Emitter, roots: list[Term]) -> list:
    """Terms and opaque call keys, each after what it uses (iterative: models are deep)."""
    def deps(item):
        if not isinstance(item, Term):
            if item in em.split:
                return [em.split[item][0]]  # x: the weights are written as their blocks
            call = em.program.opaque[item]
            return [x for x in leaves((call.args, call.kwargs)) if isinstance(x, Term)]
        if not OPS[item.op].is_leaf and em.fold_params(item):
            return []  # a folded initializer reads nothing
        if id(item) in em.heads:
            attention, *xs, _, _ = em.heads[id(item)]
            return [x for x, _ in xs] + list(attention.args[3:])
        if id(item) in em.unflattened:
            return em.unflattened[id(item)][1]
        return [em.producer[item.attrs[0]]] if item.op == "opaque" and item.attrs[0] in em.producer else list(item.args)
    return topological(roots, deps, lambda item: id(item) if isinstance(item, Term) else item)


def _unfused_residuals(nodes: list[onnx.NodeProto]) -> None:
    """An Add that only LayerNormalization reads is written as Sum, the same single addition: onnxruntime's CPU provider
    fuses Add + LayerNormalization into SkipLayerNormalization, slower than the two (bench/onnx_zoo.py prints both)."""
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in nodes:
        for i, x in [*enumerate(n.input), *((-1, x) for x in subgraph_reads(n))]:
            readers.setdefault(x, []).append((n, i))
    for n in nodes:
        users = readers.get(n.output[0], []) if n.op_type == "Add" and not n.domain else []
        if users and all(u.op_type == "LayerNormalization" and i == 0 for u, i in users):
            n.op_type = "Sum"


def export(src: OnnxProgram, program: Program | None = None) -> onnx.ModelProto:
    """The ModelProto of ``program`` (default: the imported one) with ``src``'s interface."""
    program = program or src.program
    em, outputs = Emitter(src, program), list(leaves(program.outputs))
    claimed = {id(term): name for term, name in reversed(list(zip(outputs, src.output_names)))
               if not OPS[term.op].is_leaf}  # results are computed into output names (the first one's)
    for item in _schedule(em, outputs):
        if isinstance(item, Term):
            em.emit(item, claimed.get(id(item)))
        else:
            em.copy_opaque(item)
    for term, name in zip(outputs, src.output_names):
        if (value := em.value(term, None)) != name:
            em.nodes.append(helper.make_node("Identity", [value], [name], name=em.fresh("output")))
    _unfused_residuals(em.nodes)
    while True:  # the nodes an output reads, through others (an operand an emitter wrote and then did without,
        # the Not of a Where whose branches it swapped, is dropped), and the names they and outputs read
        read = {x for n in em.nodes for x in list(n.input) + subgraph_reads(n)} | set(src.output_names)
        if len(kept := [n for n in em.nodes if any(o in read for o in n.output if o)]) == len(em.nodes):
            break
        em.nodes[:] = kept
    graph = src.model.graph
    defaults = overridable(graph)  # inputs still (every input is kept), their initializers the defaults
    initializers = [t for t in graph.initializer if t.name in defaults] + \
        [t for name, t in em.initializers.items() if name in read]  # folded ones' sources
    new_graph = helper.make_graph(em.nodes, graph.name, list(graph.input), list(graph.output), initializers,
                                  doc_string=graph.doc_string)
    model = helper.make_model(new_graph, opset_imports=list(src.model.opset_import), functions=src.model.functions,
                              producer_name="egraph-opt", ir_version=src.model.ir_version, domain=src.model.domain,
                              model_version=src.model.model_version, doc_string=src.model.doc_string)
    model.metadata_props.extend(src.model.metadata_props)
    return model
