"""Patterns over several terms that the ONNX backend writes as fewer nodes than term by term, for
onnxruntime to run: attention between a split into heads and their merge (one Attention over the
unsplit values), a product between a flattening and its undoing (one MatMul over the unflattened
operand), and a Split of a product by stored weights (a product per part). Each finds its cases over
the program before emission; the backend asks for them by term id or opaque key."""
from __future__ import annotations

import math
from collections import Counter
from typing import Callable

import numpy as np
import onnx

from .onnx_emitters import full_rows
from ..lang.ops import OPS, parse_shape
from ..lang.term import Term, postorder


def _uses(roots: list[Term], order: list[Term]) -> Counter:
    """How many terms read each term, plus one for a root (an output or an opaque call's operand):
    a pattern may drop a term that only it reads."""
    return Counter(id(a) for t in order for a in t.args) + Counter(id(r) for r in roots)


def _swapped(t: Term) -> Term | None:
    """The operand of a swap of axes 1 and 2 of a rank-4 value (heads and sequence), else None."""
    if t.op == "permute" and t.attrs[0] == "0,2,1,3" or \
            t.op == "transpose" and sorted(t.attrs) in ([1, 2], [-3, -2]):
        return t.args[0]
    return None


def _heads_of(t: Term, shapes: dict) -> tuple[Term, int] | None:
    """(x, H) when ``t`` is x (batch, seq, H * D) split into H heads: viewed as (batch, seq, H,
    D), then heads and sequence swapped."""
    view = _swapped(t)
    if view is None or view.op != "reshape":
        return None
    x, split = view.args[0], parse_shape(view.attrs[0])
    whole = shapes[id(x)][0]
    if len(split) != 4 or len(whole) != 3 or split[:2] != whole[:2] or split[2] * split[3] != whole[2]:
        return None
    return x, split[2]


def heads_merged(roots: list[Term], shapes: dict) -> dict[int, tuple]:
    """Attention whose operands are split into heads and whose only use merges them back, written at
    opset 23 as one Attention over the unsplit (batch, seq, hidden) values: merged term id ->
    (attention, x of q, k and v, H, the shape to reshape its output to, or None)."""
    order = postorder(roots)
    uses = _uses(roots, order)
    found = {}
    for t in order:
        attention = _swapped(t.args[0]) if t.op == "reshape" else None
        if attention is None or OPS[attention.op].onnx != "Attention" or \
                uses[id(attention)] != 1 or uses[id(t.args[0])] != 1:
            continue
        heads = [_heads_of(a, shapes) for a in attention.args[:3]]
        if None not in heads and len({h for _, h in heads}) == 1:
            (xq, h), (xk, _), (xv, _) = heads
            written = shapes[id(xq)][0][:2] + shapes[id(xv)][0][2:]  # what Attention writes
            found[id(t)] = (attention, xq, xk, xv, h, None if shapes[id(t)][0] == written else t.attrs[0])
    return found


def attention_over_heads(em, attention: Term, xq: Term, xk: Term, xv: Term, heads: int,
                         reshape_to: str | None) -> str:
    scale, causal = attention.attrs if attention.op == "sdpa" else (attention.attrs[0], False)
    inputs = [em.value(xq), em.value(xk), em.value(xv)] + [full_rows(em, a, xq, xk) for a in attention.args[3:]]
    out = em.node("Attention", inputs, "attention", scale=scale, is_causal=int(causal),
                  q_num_heads=heads, kv_num_heads=heads)
    return out if reshape_to is None else em.node("Reshape", [out, em.ints(parse_shape(reshape_to))],
                                                  "reshape")


def _repeated_heads(t: Term, shapes: dict) -> tuple[Term, int] | None:
    """(x, G) when ``t`` is x (B, Hkv, T, D) with each head repeated G times in a row (the
    grouped-query attention's repeat_kv: x viewed as (B, Hkv, 1, T, D), expanded to (B, Hkv, G, T,
    D), merged to (B, Hkv * G, T, D)), else None."""
    expand = t.args[0] if t.op == "reshape" else None
    view = expand.args[0] if expand is not None and expand.op == "expand" else None
    if view is None or view.op != "reshape":
        return None
    x, viewed, wide, out = view.args[0], shapes[id(view)][0], shapes[id(expand)][0], shapes[id(t)][0]
    shape = shapes[id(x)][0]
    if len(shape) != 4 or viewed != shape[:2] + (1,) + shape[2:] or len(wide) != 5 or \
            wide[:2] + wide[3:] != shape[:2] + shape[2:] or out != (shape[0], shape[1] * wide[2]) + shape[2:]:
        return None
    return x, wide[2]


def kv_grouped(roots: list[Term], shapes: dict) -> dict[int, tuple[Term, Term]]:
    """Attention over 4-D q, k, v whose k and v repeat each of fewer heads alike (grouped-query
    attention): Attention (opset 23) takes the unrepeated k and v and repeats them itself, without
    the copies: attention id -> (k, v) unrepeated."""
    found = {}
    for t in postorder(roots):
        if OPS[t.op].onnx != "Attention" or len(shapes[id(t.args[0])][0]) != 4:
            continue
        k, v = (_repeated_heads(a, shapes) for a in t.args[1:3])
        if k is not None and v is not None and k[1] == v[1]:
            found[id(t)] = (k[0], v[0])
    return found


def _product(t: Term, shapes: dict) -> tuple[Term, Callable[[Term], Term]] | None:
    """(a, rebuild) when ``t`` is matmul(a, w), matmul(a, w) +- b (either order) or linear(a, w, b)
    with a bias b of at most one axis (it broadcasts along the last axis only): rebuild(x) is the
    same product of x."""
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
    """reshape(p(reshape(x, (M, K))), L + (N,)), p a product by a matrix (plus a bias, ``_product``),
    M the product of L and x of shape L + (K,): the flattening exporters write around a 2-D Gemm,
    which MatMul does not need (it broadcasts over the leading axes: the same products in the same
    order), written as p(x): outer reshape id -> (p(x), the program's terms it reads). The
    flattening may also be the merge of an attention's heads (``heads``) whose Attention writes
    L + (K,) and that nothing else reads: its reshape goes (the entry in ``heads`` is changed so)."""
    order = postorder(roots)
    uses = _uses(roots, order)
    found = {}
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
            if x is None or shapes[id(xq)][0][:2] + shapes[id(xv)][0][2:] != lead + (k,):  # Attention's
                continue
            heads[id(flat)] = (attention, xq, xk, xv, h, None)
        new = product[1](x)
        reads, stack = [], [new]
        while stack:  # the program's terms it reads: x, the weight, the bias
            u = stack.pop()
            if id(u) in uses or u is x:
                reads.append(u)
            else:
                stack += u.args
        found[id(t)] = (new, reads)
    return found


def products_split(program, shapes: dict, unflattened: dict) -> dict[str, tuple[Term, Term, Term | None, list[int]]]:
    """Split (ONNX, opaque) along the last axis of x @ w (+ b), w a stored matrix and b a stored
    vector (maybe unflattened, ``matmuls_unflattened``), that nothing else reads: one product per
    part, by w's (and b's) column block, makes the same numbers without the copy Split makes:
    opaque key -> (x, w, b or None, the parts' sizes)."""
    roots = program.roots()
    uses = _uses(roots, postorder(roots))
    found = {}
    for key, call in program.opaque.items():
        node, outer = call.target, call.args[0] if call.args else None
        if not isinstance(node, onnx.NodeProto) or node.op_type != "Split" or \
                node.domain not in ("", "ai.onnx") or not isinstance(outer, Term) or uses[id(outer)] != 1:
            continue
        fresh = id(outer) in unflattened  # made for this export: read once, by the Split
        t, bias = unflattened[id(outer)][0] if fresh else outer, None
        if t.op == "linear" and t.args[1].op == "transpose" and t.args[1].attrs == (-2, -1):  # x @ w + b, fused
            t, bias, fresh = Term("matmul", (t.args[0], t.args[1].args[0])), t.args[2], True
            if bias.op != "param":
                continue
        elif t.op == "add":
            t, bias = next(((m, b) for m, b in (t.args, t.args[::-1]) if m.op == "matmul"), (t, None))
            if bias is None or bias.op != "param":
                continue
        if t.op != "matmul" or not (fresh or uses[id(t)] == 1) or t.args[1].op != "param":
            continue
        x, w = t.args
        rank, n = len(shapes[id(x)][0]), shapes[id(w)][0]
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if len(n) != 2 or axis not in (-1, rank - 1) or bias is not None and shapes[id(bias)][0] != n[1:]:
            continue  # a bias sliced with w's columns holds one value per column
        sizes = call.args[1] if len(call.args) > 1 and call.args[1] is not None else None
        if sizes is not None:
            sizes = [int(v) for v in program.params[sizes.attrs[0]].tolist()] if sizes.op == "param" else None
        elif n[1] % len(node.output) == 0:
            sizes = [n[1] // len(node.output)] * len(node.output)
        if sizes and sum(sizes) == n[1] and len(sizes) == len(node.output) and all(node.output):
            found[key] = (x, w, bias, sizes)
    return found


def split_product(em, key: str, x: Term, w: Term, bias: Term | None, sizes: list[int]) -> None:
    """Each output of the Split as x @ w[:, block] (+ b[block]), under its own name."""
    weight, b = em.program.params[w.attrs[0]].numpy(), None if bias is None else \
        em.program.params[bias.attrs[0]].numpy()
    start = 0
    for out, size in zip(em.program.opaque[key].target.output, sizes):
        block = slice(start, start + size)
        product = em.node("MatMul", [em.value(x), em.tensor(np.ascontiguousarray(weight[:, block]), "weight")],
                          "matmul")
        if b is not None:
            product = em.node("Add", [product, em.tensor(np.ascontiguousarray(b[block]), "bias")], "add")
        em.nodes[-1].output[0] = out
        start += size
