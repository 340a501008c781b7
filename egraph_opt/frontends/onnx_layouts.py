"""Layouts exporters write around batched products, read back as the products over heads they are: (B * H, T, D)
reshapes around a 3-D MatMul (torch's bmm and baddbmm, the dynamo exporter's K^T) become the 4-D product and
transposes, so one attention rule matches every spelling. Each is an exact identity of row-major reshapes."""
from __future__ import annotations

import contextlib
import math

import onnx

from . import forms
from .forms import Unsupported
from ..lang.ops import shape_attr
from ..lang.term import Term

#: elementwise ONNX operators a product's scores pass through between bmm and the split to heads
_ELEMENTWISE = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


def attr(node: onnx.NodeProto, name: str, default=None):
    a = next((a for a in node.attribute if a.name == name), None)
    value = default if a is None else onnx.helper.get_attribute_value(a)
    return value.decode() if isinstance(value, bytes) else value


def standard(node, op_type: str) -> bool:
    return isinstance(node, onnx.NodeProto) and node.op_type == op_type and node.domain in ("", "ai.onnx")


def swapped_in_bulk(im, name: str, out: tuple) -> Term | None:
    """x (..., T, D) with its leading dims merged, its last two swapped, then split to (..., D, T): x with its last two
    swapped (the dynamo exporter's K^T over heads), its leading dims reshaped where the split differs (K repeated for
    grouped-query heads, (B, Hkv, G, T, D) merged and split as (B, Hkv * G, D, T))."""
    swap = im.producers.get(name)
    merge = standard(swap, "Transpose") and im.producers.get(swap.input[0])
    if not standard(merge, "Reshape") or list(attr(swap, "perm", [])) != [0, 2, 1]:
        return None
    with contextlib.suppress(Unsupported):
        dims, merged = im.static(merge.input[0]), im.static(merge.output[0])
        if len(dims) >= 3 and len(out) >= 3 and merged[1:] == dims[-2:] and out[-2:] == dims[-2:][::-1] \
                and math.prod(out[:-2]) == merged[0]:
            x, lead = im.term(merge.input[0]), out[:-2] + dims[-2:]
            return Term("transpose", (x if lead == dims else Term("reshape", (x,), (shape_attr(lead),)),), (-2, -1))
    return None


def _heads(im, name: str) -> tuple[Term, tuple] | None:
    """(x, (B, H)) when ``name`` is x (B, H, T, D) merged to (B * H, T, D), or that with its last two swapped (x^T)."""
    node = im.producers.get(name)
    swapped = standard(node, "Transpose") and list(attr(node, "perm", [])) == [0, 2, 1]
    merge = im.producers.get(node.input[0]) if swapped else node
    if not standard(merge, "Reshape"):
        return None
    dims, merged = im.static(merge.input[0]), im.static(merge.output[0])
    if len(dims) != 4 or merged != (dims[0] * dims[1],) + dims[2:]:
        return None
    x = im.term(merge.input[0])
    return (Term("transpose", (x,), (-2, -1)) if swapped else x), dims[:2]


def bmm_split(im, name: str, out: tuple) -> Term | None:
    """A 3-D product of (B * H, ...) merges of 4-D operands, maybe scaled and biased elementwise by constants (baddbmm:
    BLOOM's alibi), split back to (B, H, M, N): the 4-D product, then the same steps over the constants' rows as 4-D."""
    steps = []  # (op, constant name, whether it comes first), from the split down to the product
    node = im.producers.get(name)
    while node is not None and not standard(node, "MatMul"):
        consts = [i for i, x in enumerate(node.input) if x in im.consts]
        if not (standard(node, node.op_type) and node.op_type in _ELEMENTWISE and len(node.input) == 2
                and len(consts) == 1):
            return None
        steps.append((_ELEMENTWISE[node.op_type], node.input[consts[0]], consts[0] == 0))
        node = im.producers.get(node.input[1 - consts[0]])
    if node is None or not im.dtype(name).startswith(("float", "bfloat")):
        return None
    with contextlib.suppress(Unsupported):
        a, b = _heads(im, node.input[0]), _heads(im, node.input[1])
        if a is None or b is None or a[1] != b[1] or out != a[1] + im.static(node.output[0])[1:]:
            return None
        t = Term("matmul", (a[0], b[0]))
        for op, c, first in reversed(steps):
            array = im.consts[c]
            if array.size == 1:
                operand = forms.constant(array.reshape(()), im.dtype(name))
            else:
                rows = (1,) * (3 - array.ndim) + array.shape if array.ndim <= 3 else None
                if rows is None or rows[0] not in (1, math.prod(out[:2])):
                    return None
                lead = out[:2] if rows[0] != 1 else (1, 1)
                operand = Term("reshape", (im.term(c),), (shape_attr(lead + rows[1:]),))
            t = forms.binary(op, operand, t) if first else forms.binary(op, t, operand)
        return t
    return None
