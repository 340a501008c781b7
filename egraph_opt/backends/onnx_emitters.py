"""``EMIT``: the form an op declares (``Op.onnx``) -> the function that writes it, given the
backend's ``Emitter``, the term and its attributes; it returns the name of the value it wrote.

Fused ops become the standard operator of the model's opset (LayerNormalization from 17, Gelu from
20, Attention and RMSNormalization from 23) or, before it, their definition spelled as onnxruntime's own fusions expect
it (Gelu as a Div by sqrt(2); MatMul, Mul, Add, Softmax, MatMul), so they cost nothing there."""
from __future__ import annotations

import math

import numpy as np

from ..frontends.onnx_converters import AXES_INPUT_SINCE, ELEM_TYPES
from ..lang import pattern
from ..lang.ops import ACTIVATIONS, OPS, parse_shape, shape_attr
from ..lang.term import Term, topological

#: ONNX operators that are one node over the op's operands: every operator an op declares
#: (``Op.onnx``) that ``EMIT`` gives no writer of its own; the losses' semantics are torch's
SIMPLE = {op.onnx for op in OPS.values() if op.onnx and op.onnx[:1].isupper()}
#: ops of the Term language that ONNX has no operator or decomposition for (they declare
#: ``onnx="none"``: the mesh ops, which a single ONNX model cannot express): export refuses them
NO_ONNX_FORM: frozenset[str] = frozenset(name for name, op in OPS.items() if op.onnx == "none")


class OnnxExportError(ValueError):
    """A term that has no ONNX form at this opset: names the op and why."""


def _args(em, t: Term) -> list[str]:
    """Operand names; a constant operand takes the element type of its tensor sibling (of a where,
    a value operand: never its bool condition; float32 where both values are constants)."""
    tensors = [a for a in (t.args[1:] if t.op == "where" else t.args) if a.op != "const"]
    return [em.value(a, tensors[-1] if tensors else None) for a in t.args]


def emit_tree(em, root: Term) -> str:
    """Emit a decomposition built from Terms (its leaves are already emitted), down to the values
    already written only (below one may lie what a fused form skipped: split heads)."""
    em.alive.append(root)
    written: dict[tuple, str] = {}  # a definition naming a subterm twice (the guard's softmax) writes it once
    for u in topological([root], lambda u: () if id(u) in em.names else u.args, id):
        if id(u) in em.names:
            continue
        if u.op == "const" or OPS[u.op].is_leaf:
            em.emit(u, None)
            continue
        key = (u.op, u.attrs, tuple((a.op, a.attrs) if a.op == "const" else em.names[id(a)] for a in u.args))
        if key in written:
            em.names[id(u)] = written[key]
            continue
        em.emit(u, None)
        written[key] = em.names[id(u)]
    return em.value(root)


def _definition(em, t, *attrs):
    """An op with no ONNX operator, written as the definition in primitive ops it declares."""
    return emit_tree(em, pattern.defined(_repeated_kv(em, t) if OPS[t.op].shape_rule == "sdpa" else t))


def _repeated_kv(em, t: Term) -> Term:
    """Attention over k and v of fewer heads than q (``ops.groups``) as one over them repeated to
    q's heads, as transformers' repeat_kv does: for the forms that take one count of heads."""
    shapes, args = [em._meta(a)[0] for a in t.args[:3]], list(t.args)
    for i, (*b, h, n, d) in enumerate(shapes[1:] if min(map(len, shapes)) > 2 else (), 1):  # of heads
        if 1 < h < (heads := shapes[0][-3]):
            wide = Term("expand", (Term("reshape", (args[i],), (shape_attr((*b, h, 1, n, d)),)),),
                        (shape_attr((*b, h, heads // h, n, d)),))
            args[i] = Term("reshape", (wide,), (shape_attr((*b, heads, n, d)),))
    return Term(t.op, tuple(args), t.attrs)


def _simple(em, t, *attrs):
    """One operator over the operands, the op's attributes by name (ONNX and torch name them alike)."""
    named = {name: value for (name, _), value in zip(OPS[t.op].attrs, attrs)}
    return em.node(OPS[t.op].onnx, _args(em, t), t.op, **named)


def _where(em, t):
    """Where; of a negated condition, the branches swapped (the fill where the mask is set, as
    masked_fill wrote it: sdpa_filled keeps the keys not masked), its Not then read by none."""
    cond, a, b = t.args
    return emit_tree(em, Term("where", (cond.args[0], b, a))) if cond.op == "logical_not" else _simple(em, t)


def stored_reciprocal(c: float, dtype: str | None) -> float | None:
    """d when c == 1/d for a d that ``dtype`` stores while c itself it does not: c is what
    canonicalizing ``x / d`` into ``x * (1/d)`` made, not a constant the model held.
    >>> sqrt2 = float(np.float32(math.sqrt(2)))  # as the model stores it
    >>> stored_reciprocal(1 / sqrt2, "float32") == sqrt2
    True
    >>> stored_reciprocal(0.5, "float32") is None
    True
    """
    if dtype not in ("float32", "float16") or c == 0 or not math.isfinite(c):
        return None
    kind = np.dtype(dtype).type
    d = float(kind(1 / c))
    return None if float(kind(c)) == c or d == 0 or not math.isfinite(d) or 1 / d != c else d


def _mul(em, t):
    """A product by such a reciprocal goes back to the division: exact, what onnxruntime's fusions match."""
    x, c = t.args if t.args[1].op == "const" else t.args[::-1]
    d = stored_reciprocal(c.attrs[0], em.dtype(x)) if c.op == "const" and x.op != "const" else None
    return _simple(em, t) if d is None else em.node("Div", [em.value(x), em.scalar(d, em.dtype(x))], "div")


def _reduce(em, t, axis, keep):
    op, x = OPS[t.op].onnx, em.value(t.args[0])
    return em.node(op, [x, em.ints([axis], "axes")], t.op, keepdims=int(keep)) if em.opset >= AXES_INPUT_SINCE[op] \
        else em.node(op, [x], t.op, axes=[axis], keepdims=int(keep))


def _var(em, t, axis, keep, correction):
    """Mean of squared deviations, times n / (n - correction) with n the static axis size."""
    x = t.args[0]
    centered = Term("sub", (x, Term("mean", (x,), (axis, True))))
    out = Term("mean", (Term("mul", (centered, centered)),), (axis, keep))
    if correction:
        if (shape := em.static_shape(x)) is None:
            raise OnnxExportError("var with a correction over a dynamic shape: its axis size is unknown at export")
        n = shape[axis]
        out = Term("mul", (out, Term.const(n / (n - correction) if n > correction else math.nan)))
    return emit_tree(em, out)


def _log1p(em, t):
    """ONNX has no log1p, and log(1 + x) loses every digit of a tiny x (why the rewrite made log1p). Kahan's
    form, exact to a few ulps: log(u) * x / (u - 1), u = 1 + x rounded; x itself where u rounds to 1."""
    x, one = em.value(t.args[0]), em.scalar(1.0, em.dtype(t.args[0]))
    u = em.node("Add", [x, one], "log1p")
    u_minus_1 = em.node("Sub", [u, one], "log1p")
    ratio = em.node("Mul", [em.node("Log", [u], "log1p"), em.node("Div", [x, u_minus_1], "log1p")], "log1p")
    return em.node("Where", [em.node("Equal", [u, one], "log1p"), x, ratio], "log1p")


def _expm1(em, t):
    """ONNX has no expm1, and exp(x) - 1 loses every digit of a tiny x. Kahan's form: (u - 1) * x / log(u), u = exp(x)
    rounded; x where u rounds to 1, -1 where u - 1 does, u where u - 1 == u (large x: inf / inf)."""
    x, dtype = em.value(t.args[0]), em.dtype(t.args[0])
    one, minus_one, u = em.scalar(1.0, dtype), em.scalar(-1.0, dtype), em.node("Exp", [x], "expm1")
    u_minus_1 = em.node("Sub", [u, one], "expm1")
    r = em.node("Mul", [u_minus_1, em.node("Div", [x, em.node("Log", [u], "expm1")], "expm1")], "expm1")
    r = em.node("Where", [em.node("Equal", [u, one], "expm1"), x, r], "expm1")
    r = em.node("Where", [em.node("Equal", [u_minus_1, minus_one], "expm1"), minus_one, r], "expm1")
    return em.node("Where", [em.node("Equal", [u_minus_1, u], "expm1"), u, r], "expm1")


def _compensated_sum(em, t, axis, keep):
    """ONNX has no compensated sum: a float64 accumulator, at least as accurate."""
    x = t.args[0]
    wide = Term("sum", (Term("cast", (x,), ("float64",)),), (axis, keep))
    return emit_tree(em, Term("cast", (wide,), (em.dtype(x) or "float32",)))


def _transpose(em, t, *attrs):
    """A swap of two axes (dim0, dim1), or a permutation (one shape_attr string)."""
    if len(attrs) == 1:
        return em.node("Transpose", [em.value(t.args[0])], t.op, perm=list(parse_shape(attrs[0])))
    if (rank := em.rank(t.args[0])) is None:
        raise OnnxExportError("transpose of a value of unknown rank")
    perm = list(range(rank))
    perm[attrs[0]], perm[attrs[1]] = perm[attrs[1]], perm[attrs[0]]
    return em.node("Transpose", [em.value(t.args[0])], "transpose", perm=perm)


def _norm(em, t, eps):
    """LayerNormalization (from opset 17) or RMSNormalization (23), a scalar weight or bias filled to a static
    normalized size (a bias of 0 left out); else the definition."""
    (x, w, *b), layer = t.args, t.op == "layer_norm"
    shape = em.static_shape(x)
    if em.opset >= (17 if layer else 23) and (shape or all(a.op != "const" for a in (w, *b))):
        def operand(a, hint):
            return em.value(a) if a.op != "const" else \
                em.tensor(np.full(shape[-1:], a.attrs[0], np.dtype(em.dtype(x) or "float32")), hint)
        inputs = [em.value(x), operand(w, "scale")] + [operand(a, "bias") for a in b if a.op != "const" or a.attrs[0]]
        return em.node("LayerNormalization" if layer else "RMSNormalization", inputs, t.op, axis=-1, epsilon=eps)
    if layer:
        centered = Term("sub", (x, Term("mean", (x,), (-1, True))))
        var = Term("mean", (Term("mul", (centered, centered)),), (-1, True))
        norm = Term("div", (centered, Term("sqrt", (Term("add", (var, Term.const(eps))),))))
        return emit_tree(em, Term("add", (Term("mul", (norm, w)), b[0])))
    square = Term("mean", (Term("mul", (x, x)),), (-1, True))
    norm = Term("mul", (x, Term("rsqrt", (Term("add", (square, Term.const(eps))),))))
    return emit_tree(em, norm if w.op == "const" and w.attrs[0] == 1.0 else Term("mul", (norm, w)))


def _gelu(em, t, approximate):
    if em.opset >= 20:
        return em.node("Gelu", [em.value(t.args[0])], "gelu", approximate=approximate)
    x, c = t.args[0], Term.const
    if approximate == "tanh":  # torch's export of GPT-2's gelu: what onnxruntime fuses as FastGelu
        cube = Term("mul", (Term("pow", (x, c(3.0))), c(0.044715)))
        inner = Term("mul", (Term("add", (x, cube)), c(math.sqrt(2 / math.pi))))
        return emit_tree(em, Term("mul", (Term("mul", (x, c(0.5))), Term("add", (Term("tanh", (inner,)), c(1.0))))))
    # torch's own export of gelu: the spelling onnxruntime's Gelu fusion recognizes
    gate = Term("erf", (Term("div", (x, c(math.sqrt(2)))),))
    return emit_tree(em, Term("mul", (Term("mul", (x, c(0.5))), Term("add", (c(1.0), gate)))))


def _sdpa(em, t, scale, causal=False):
    """sdpa (q, k, v; scale, causal), sdpa_masked and sdpa_guarded (q, k, v, bias; scale): Attention at opset 23 (rank
    4, or rank 3 as one head; it differs from sdpa_guarded only on rows whose scores overflow: NaN, not 0), else
    softmax(q k^T * scale + bias) v, or the definition an op declares (the guard)."""
    standard = em.opset >= 23 and em.rank(t.args[0]) in (3, 4)
    t = t if standard and em.rank(t.args[0]) == 4 else _repeated_kv(em, t)  # Attention reads fewer heads
    q, k, v, *bias = t.args
    if not standard and OPS[t.op].definition:
        return _definition(em, t, scale)
    bias = [full_rows(em, b, q, k) if standard else em.value(b) for b in bias]
    if standard:
        return em.node("Attention", [em.value(q), em.value(k), em.value(v)] + bias, "attention", scale=scale,
                       is_causal=int(causal), **({"q_num_heads": 1, "kv_num_heads": 1} if em.rank(q) == 3 else {}))
    bias += [_causal_bias(em, q, k)] if causal else []
    scores = Term("matmul", (q, Term("transpose", (k,), (-2, -1))))
    scores = emit_tree(em, scores if scale == 1.0 else Term("mul", (scores, Term.const(scale))))
    scores = em.node("Add", [scores, bias[0]], "masked") if bias else scores
    return em.node("MatMul", [em.node("Softmax", [scores], "softmax", axis=-1), emit_tree(em, v)],
                   "attention")  # v repeated to q's heads above: a tree to write


def full_rows(em, bias, q, k) -> str:
    """Attention's mask with a row per query: onnxruntime (1.32) rejects one broadcast along the
    queries ((B, H, 1, T): a padding mask, a position bias), so it is expanded to them."""
    if bias.op == "const":
        return em.value(bias, q)
    shape, qs, ks = em.static_shape(bias), em.static_shape(q), em.static_shape(k)
    return em.value(bias) if shape is None or qs is None or ks is None or len(shape) >= 2 and shape[-2] == qs[-2] \
        else em.node("Expand", [em.value(bias), em.ints(list(shape[:-2]) + [qs[-2], ks[-2]])], "mask")


def _causal_bias(em, q, k) -> str:
    """The additive mask of causal attention (-inf above the diagonal): needs static lengths."""
    qs, ks = em.static_shape(q), em.static_shape(k)
    if qs is None or ks is None:
        raise OnnxExportError(f"causal attention over dynamic lengths needs the Attention operator "
                              f"(opset 23), the model has opset {em.opset}")
    return em.tensor(np.triu(np.full((qs[-2], ks[-2]), -np.inf, np.dtype(em.dtype(q) or "float32")), 1), "causal_mask")


def _linear(em, t):
    x, w, b = t.args
    return em.node("Gemm", _args(em, t), "linear", transB=1) if em.rank(x) == 2 else \
        emit_tree(em, Term("add", (Term("matmul", (x, Term("transpose", (w,), (-2, -1)))), b)))


def _linear_act(em, t, activation):
    op, attrs = ACTIVATIONS[activation]
    return emit_tree(em, Term(op, (Term("linear", t.args),), attrs))


def _conv2d(em, t, stride, padding, dilation, groups):
    """Conv; a scalar bias is added after it (none when it is 0)."""
    x, w, b = t.args
    pads, inputs = list(parse_shape(padding)), [em.value(x), em.value(w)] + ([] if b.op == "const" else [em.value(b)])
    out = em.node("Conv", inputs, "conv", strides=list(parse_shape(stride)), pads=pads + pads,
                  dilations=list(parse_shape(dilation)), group=groups)
    return em.node("Add", [out, em.value(b, x)], "conv_bias") if b.op == "const" and b.attrs[0] != 0.0 else out


def _max_pool2d(em, t, kernel, stride, padding, dilation):
    pads = list(parse_shape(padding))
    return em.node("MaxPool", [em.value(t.args[0])], "max_pool", kernel_shape=list(parse_shape(kernel)),
                   strides=list(parse_shape(stride)), pads=pads + pads, dilations=list(parse_shape(dilation)))


def _batch_norm(em, t, eps):
    x, mean, var, weight, bias = t.args
    if any(a.op == "const" for a in (mean, var, weight, bias)):
        raise OnnxExportError("batch_norm with scalar statistics has no BatchNormalization form")
    return em.node("BatchNormalization", [em.value(a) for a in (x, weight, bias, mean, var)], "batch_norm", epsilon=eps)


def _concat(em, t, axis):
    parts, stack = [], [t]
    while stack:  # a chain of binary concats on one axis is one Concat
        u = stack.pop()
        if u.op == "concat" and u.attrs[0] == axis and (u is t or id(u) not in em.names):
            stack.extend(reversed(u.args))
        else:
            parts.append(em.value(u))
    return em.node("Concat", parts, "concat", axis=axis)


def _logaddexp(em, t):
    """max(a, b) + softplus(-|a - b|): no exp overflows, and softplus is exact for small terms."""
    a, b = t.args
    gap = Term("neg", (Term("abs", (Term("sub", (a, b)),)),))
    return emit_tree(em, Term("add", (Term("maximum", (a, b)), Term("softplus", (gap,)))))


def _atan2(em, t):
    """ONNX has no atan2: atan(y / x), +-pi in the left half-plane (x < 0 or -0), +-pi/2 on the y axis, signed zeros."""
    y, x = t.args
    dtype, yv, xv = em.dtype(y) if y.op != "const" else em.dtype(x), em.value(y, x), em.value(x, y)
    def n(op: str, *inputs: str) -> str:
        return em.node(op, list(inputs), "atan2")
    zero, pi, base = em.scalar(0.0, dtype), em.scalar(math.pi, dtype), n("Atan", n("Div", yv, xv))
    left = n("Or", n("Less", xv, zero), n("And", n("Equal", xv, zero), n(
        "Equal", n("Div", em.scalar(1.0, dtype), xv), em.scalar(-math.inf, dtype))))
    y_neg = n("Or", n("Less", yv, zero), n("Equal", n("Div", em.scalar(1.0, dtype), yv), em.scalar(-math.inf, dtype)))
    shift, both_zero = n("Where", y_neg, n("Neg", pi), pi), n("And", n("Equal", xv, zero), n("Equal", yv, zero))
    at_zero = n("Where", left, shift, n("Mul", yv, zero))
    return n("Where", both_zero, at_zero, n("Where", left, n("Add", base, shift), base))


def _cbrt(em, t):
    """ONNX has no cube root, and Pow of a negative base is NaN: sign(x) |x|^(1/3)."""
    x = em.value(t.args[0])
    root = em.node("Pow", [em.node("Abs", [x], "cbrt"), em.scalar(1 / 3, em.dtype(t.args[0]))], "cbrt")
    return em.node("Mul", [em.node("Sign", [x], "cbrt"), root], "cbrt")


def _rotary_caches(em, t) -> tuple[np.ndarray, np.ndarray] | None:
    """RotaryEmbedding's (B, S, D/2) cos and sin caches where x is (B, H, S, D) and cos, sin are stored (S, D) tensors,
    per batch or shared, alike over heads, with equal halves (cat(freqs, freqs)): only then is it that operator."""
    shape = em.static_shape(t.args[0])
    if em.opset < 23 or shape is None or len(shape) != 4 or any(a.op != "param" for a in t.args[1:]):
        return None
    (b, _, n, d), caches = shape, []
    for a in t.args[1:]:
        table = em.program.params[a.attrs[0]].numpy()
        table = table.reshape((1,) * (4 - table.ndim) + table.shape) if table.ndim <= 4 else None
        if table is None or table.dtype != np.dtype(em.dtype(t.args[0]) or "float32") or \
                table.shape[1] != 1 or table.shape[0] not in (1, b) or table.shape[2:] != (n, d) or \
                not np.array_equal(table[..., :d // 2], table[..., d // 2:]):
            return None
        caches.append(np.ascontiguousarray(np.broadcast_to(table[:, 0, :, :d // 2], (b, n, d // 2))))
    return caches[0], caches[1]


def _rotary(em, t):
    """RotaryEmbedding (opset 23) where its caches can be cut from the stored cos and sin (one onnxruntime kernel, not
    several passes); else x cos + rotate_half(x) sin, halved at x's static or Shape(x)[-1] // 2 last size."""
    if (caches := _rotary_caches(em, t)) is not None:
        return em.node("RotaryEmbedding", [em.value(t.args[0]), em.tensor(caches[0], "cos_cache"),
                                           em.tensor(caches[1], "sin_cache")], "rotary")
    shape = em.static_shape(t.args[0])
    x, cos, sin = (em.value(a) for a in t.args)
    last = em.ints([-1], "axes")
    half = em.ints([shape[-1] // 2], "half") if shape else em.node("Div", [em.node(
        "Slice", [em.node("Shape", [x], "rotary"), last, em.ints([2 ** 62]), em.ints([0])], "rotary"),
        em.ints([2], "two")], "rotary")
    first = em.node("Slice", [x, em.ints([0], "zero"), half, last], "rotary")
    second = em.node("Slice", [x, half, em.ints([2 ** 62]), last], "rotary")
    rotated = em.node("Concat", [em.node("Neg", [second], "rotary"), first], "rotary", axis=-1)
    return em.node("Add", [em.node("Mul", [x, cos], "rotary"), em.node("Mul", [rotated, sin], "rotary")], "rotary")


#: each ONNX form an op declares (``Op.onnx``) -> the function that writes it: an operator (one
#: node, or more around it at an older opset) or a decomposition into operators
EMIT = {
    **dict.fromkeys(SIMPLE, _simple), "Mul": _mul, "Where": _where, **dict.fromkeys(AXES_INPUT_SINCE, _reduce),
    "Gelu": _gelu, "Transpose": _transpose, "LayerNormalization": _norm, "RMSNormalization": _norm, "Attention": _sdpa,
    "Gemm": _linear, "Conv": _conv2d, "MaxPool": _max_pool2d, "BatchNormalization": _batch_norm, "Concat": _concat,
    **{op: lambda em, t, shape, _op=op: em.node(_op, [em.value(t.args[0]), em.ints(parse_shape(shape))],
                                                  _op.lower()) for op in ("Reshape", "Expand")},
    "Slice": lambda em, t, axis, start, end, step: em.node(
        "Slice", [em.value(t.args[0]), em.ints([start]), em.ints([end]), em.ints([axis]), em.ints([step])], "slice"),
    "Cast": lambda em, t, dtype: em.node("Cast", [em.value(t.args[0])], "cast", to=ELEM_TYPES[dtype]),
    # decompositions: ONNX has no operator for these
    "mean-of-squares": _var, "float64-sum": _compensated_sum, "kahan-log1p": _log1p, "kahan-expm1": _expm1,
    "linear-activation": _linear_act, "definition": _definition, "stable-logaddexp": _logaddexp,
    "quadrant-atan": _atan2, "signed-cube-root": _cbrt, "rotate-half": _rotary}
