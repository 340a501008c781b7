"""ONNX operators into Terms: one converter per op type (``Unsupported``: the node stays opaque). Initializers are
``param`` terms, so conv and batch-norm folding fire on models exported without constant folding."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from . import forms
from .forms import Unsupported
from .onnx_layouts import attr as _attr, bmm_split, swapped_in_bulk
from ..lang.ops import OPS, shape_attr
from ..lang.term import Term

#: ONNX element types the Term language names, as torch dtype names
DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.FLOAT16: "float16",
          onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32",
          onnx.TensorProto.INT16: "int16", onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8",
          onnx.TensorProto.BOOL: "bool"}
ELEM_TYPES = {name: code for code, name in DTYPES.items()}
#: reductions: the opset from which their axes are an input rather than an attribute
AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceLogSumExp": 18}


@dataclass(frozen=True)
class ValueType:
    elem_type: int
    shape: tuple | None  # per dim: int, dim_param name, or None; None when the rank is unknown


def opset_of(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


@dataclass
class Importer:
    """State of one import; converters read values through it."""
    model: onnx.ModelProto
    where: str
    types: dict[str, ValueType] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    protos: dict[str, onnx.TensorProto] = field(default_factory=dict)
    terms: dict[str, Term] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    producers: dict[str, onnx.NodeProto] = field(default_factory=dict)  # value name -> its node

    @property
    def opset(self) -> int:
        return opset_of(self.model)

    def term(self, name: str) -> Term:
        """The tensor value ``name`` as a Term (constants become ``param`` terms on first use)."""
        if name in self.terms:
            return self.terms[name]
        if name not in self.consts:
            raise Unsupported(f"{name!r} is not a tensor of the Term language")
        array = self.consts[name]
        self.protos[name] = proto = self.protos.get(name) or numpy_helper.from_array(array, name)
        if (dtype := DTYPES.get(proto.data_type)) is None:
            raise Unsupported(f"constant {name!r} has an element type the Term language lacks")
        if array.dtype.kind in "fiub":
            self.params[name] = torch.from_numpy(np.ascontiguousarray(array).copy())
        self.terms[name] = Term("param", (), (name, shape_attr(array.shape), dtype))
        return self.terms[name]

    def operand(self, name: str, other: str) -> Term:
        """An elementwise operand: a numeric size-one constant that broadcasts away is a const."""
        if (array := self.consts.get(name)) is not None and array.size == 1 and array.dtype.kind in "fiu" \
                and array.ndim <= self.rank(other):
            return forms.constant(array.reshape(()), self.dtype(other))
        return self.term(name)

    def const(self, name: str) -> np.ndarray:
        if name not in self.consts:
            raise Unsupported(f"{name!r} is not a constant")
        return self.consts[name]

    def shape(self, name: str) -> tuple:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        if (t := self.types.get(name)) is None or t.shape is None:
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
        return DTYPES.get(t.elem_type, "") if (t := self.types.get(name)) else ""

    def axis(self, name: str, dim: int) -> int:
        return forms.axis(dim, self.rank(name))


def _floating(im: Importer, name: str) -> bool:
    return im.dtype(name).startswith(("float", "bfloat"))


def _binary(op: str, floating_only: bool = False):
    def convert(im: Importer, node):
        if floating_only and not _floating(im, node.output[0] if node.output[0] in im.types else node.input[0]):
            raise Unsupported(f"{node.op_type} on integers")
        names = list(node.input)
        out = im.operand(names[0], names[1] if len(names) > 1 else names[0])
        for name in names[1:]:
            out = forms.binary(op, out, im.operand(name, names[0]))
        return out
    return convert


def _unary(op: str):
    return lambda im, node: Term(op, (im.term(node.input[0]),))


def _reduce(op: str):
    def convert(im: Importer, node):
        x, keep = node.input[0], bool(_attr(node, "keepdims", 1))
        axes = list(_attr(node, "axes", [])) if im.opset < AXES_INPUT_SINCE[node.op_type] else \
            list(im.const(node.input[1])) if len(node.input) > 1 and node.input[1] else []
        if op == "logsumexp" and len(axes) != 1:
            raise Unsupported("ReduceLogSumExp over other than one axis")
        if not axes and _attr(node, "noop_with_empty_axes", 0):
            return im.term(x)
        rank = im.rank(x)
        return forms.reduce(op, im.term(x), axes or range(rank), rank, keep)
    return convert


def _gemm(im: Importer, node):
    """Gemm with transB, unit scales and a bias of shape (N,) is ``linear``, as torch lowers it."""
    a, b = im.term(node.input[0]), im.term(node.input[1])
    alpha, beta = _attr(node, "alpha", 1.0), _attr(node, "beta", 1.0)
    has_c, trans_b = len(node.input) > 2 and node.input[2], _attr(node, "transB", 0)
    a = Term("transpose", (a,), (-2, -1)) if _attr(node, "transA", 0) else a
    if trans_b and alpha == 1.0 and beta == 1.0 and has_c and im.shape(node.input[2]) == im.shape(node.input[1])[:1]:
        return Term("linear", (a, b, im.term(node.input[2])))
    out = Term("matmul", (a, Term("transpose", (b,), (-2, -1)) if trans_b else b))
    out = out if alpha == 1.0 else Term("mul", (out, Term.const(alpha)))
    if not has_c:
        return out
    c = im.operand(node.input[2], node.output[0])
    return Term("add", (out, c if beta == 1.0 else Term("mul", (c, Term.const(beta)))))


def _transpose(im: Importer, node):
    rank = im.rank(node.input[0])
    return forms.permute(im.term(node.input[0]), _attr(node, "perm", range(rank)[::-1]), rank)


def _to_shape(op: str):
    """Reshape (also Flatten, Squeeze, Unsqueeze) and Expand to the inferred shape, when static."""
    def convert(im: Importer, node):
        out, x = im.static(node.output[0]), im.term(node.input[0])
        if im.shape(node.input[0]) == out:
            return x
        return (op == "reshape" and (swapped_in_bulk(im, node.input[0], out) or bmm_split(im, node.input[0], out))) \
            or Term(op, (x,), (shape_attr(out),))
    return convert


def _gather(op: str):
    """Gather (indices of rank 1: ``index_select``) and GatherElements (``gather``)."""
    def convert(im: Importer, node):
        if op == "index_select" and im.rank(node.input[1]) != 1:
            raise Unsupported("Gather with indices of rank other than 1")
        return Term(op, (im.term(node.input[0]), im.term(node.input[1])),
                    (im.axis(node.input[0], _attr(node, "axis", 0)),))
    return convert


def _concat(im: Importer, node):
    names = [x for x in node.input if x]
    return forms.concat(map(im.term, names), im.axis(names[0], _attr(node, "axis")))


def _slice(im: Importer, node):
    x, starts, ends = node.input[0], im.const(node.input[1]), im.const(node.input[2])
    rank, dims = im.rank(x), im.shape(x)
    axes = im.const(node.input[3]) if len(node.input) > 3 and node.input[3] else range(len(starts))
    steps, out = im.const(node.input[4]) if len(node.input) > 4 and node.input[4] else [1] * len(starts), im.term(x)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        size = dims[int(axis) % rank]
        if step <= 0 or not isinstance(size, int):
            raise Unsupported("Slice with a non-positive step or a dynamic axis")
        if (bounds := slice(int(start), int(end), int(step)).indices(size)) != (0, size, 1):
            out = Term("slice", (out,), (int(axis) % rank - rank, *bounds))
    return out


def _cast(im: Importer, node):
    if (dtype := DTYPES.get(_attr(node, "to"))) is None:
        raise Unsupported("Cast to a type the Term language lacks")
    x = im.term(node.input[0])
    return x if im.dtype(node.input[0]) == dtype else Term("cast", (x,), (dtype,))


def _softmax(op: str):
    return lambda im, node: Term(op, (im.term(node.input[0]),), (im.axis(node.input[0], _attr(node, "axis", -1)),))


def _norm(op: str):
    """LayerNormalization, RMSNormalization over the last axis, rank-1 scale (and bias; missing: the scalar const 0)."""
    def convert(im: Importer, node):
        if im.axis(node.input[0], _attr(node, "axis", -1)) != -1:
            raise Unsupported(f"{node.op_type} over several axes")
        if len(node.output) > 1 and any(node.output[1:]):
            raise Unsupported(f"{node.op_type} with its mean or inverse std as outputs")
        if any(im.rank(n) != 1 for n in node.input[1:] if n):
            raise Unsupported(f"{node.op_type} with a scale or bias of rank other than 1")
        operands = [im.term(n) for n in node.input if n]
        bias = [Term.const(0.0)] if op == "layer_norm" and len(operands) == 2 else []
        return Term(op, tuple(operands + bias), (float(_attr(node, "epsilon", 1e-5)),))
    return convert


def _window(im: Importer, node) -> tuple[str, str, str]:
    """Strides, pads (explicit, symmetric: one per spatial dim) and dilations of a 2-D window op (Conv, MaxPool)."""
    if im.rank(node.input[0]) != 4 or not _floating(im, node.input[0]):
        raise Unsupported(f"{node.op_type} over other than 2 spatial dims, or on integers")
    auto_pad = _attr(node, "auto_pad", "NOTSET")
    pads = list(_attr(node, "pads", [0, 0, 0, 0])) if auto_pad == "NOTSET" else \
        [0, 0, 0, 0] if auto_pad == "VALID" else None
    if pads is None or pads[:2] != pads[2:]:
        raise Unsupported(f"{node.op_type} with SAME padding or asymmetric pads")
    return tuple(map(shape_attr, (_attr(node, "strides", [1, 1]), pads[:2], _attr(node, "dilations", [1, 1]))))


def _conv(im: Importer, node):
    """2-D Conv with explicit symmetric pads; a missing bias is the const 0."""
    x, w = node.input[0], node.input[1]
    window, kernel = _window(im, node), im.static(w)[2:]
    if list(_attr(node, "kernel_shape", kernel)) != list(kernel):
        raise Unsupported("Conv whose kernel_shape disagrees with its weight")
    b = im.term(node.input[2]) if len(node.input) > 2 and node.input[2] else Term.const(0.0)
    return Term("conv2d", (im.term(x), im.term(w), b), (*window, int(_attr(node, "group", 1))))


def _max_pool(im: Importer, node):
    """2-D MaxPool with floor rounding, explicit symmetric pads and no Indices output."""
    window = _window(im, node)
    if _attr(node, "ceil_mode", 0) or _attr(node, "storage_order", 0) or (len(node.output) > 1 and node.output[1]):
        raise Unsupported("MaxPool with ceil_mode, storage_order or its Indices output")
    return Term("max_pool2d", (im.term(node.input[0]),), (shape_attr(_attr(node, "kernel_shape")), *window))


def _batch_norm(im: Importer, node):
    """Inference BatchNormalization (running statistics); its training outputs must be unused."""
    if _attr(node, "training_mode", 0):
        raise Unsupported("BatchNormalization in training mode")
    x, scale, bias, mean, var = (im.term(n) for n in node.input[:5])
    return Term("batch_norm", (x, mean, var, scale, bias), (float(_attr(node, "epsilon", 1e-5)),))


def _dropout(im: Importer, node):
    """Inference dropout is the identity (its mask output must stay unused)."""
    if len(node.input) > 2 and node.input[2] and bool(im.const(node.input[2])):
        raise Unsupported("Dropout in training mode")
    return im.term(node.input[0])


def _class_loss(op: str):
    """NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss (class axis 1, as torch's): unweighted,
    the loss alone. With no ignore_index, int64's least value (no valid target) ignores none."""
    def convert(im: Importer, node):
        if len(node.input) > 2 and node.input[2] or any(node.output[1:]):
            raise Unsupported(f"{node.op_type} with class weights or its log-probabilities as an output")
        return Term(op, (im.term(node.input[0]), im.term(node.input[1])),
                    (_attr(node, "reduction", "mean"), int(_attr(node, "ignore_index", -2 ** 63))))
    return convert


CONVERTERS = {
    "Add": _binary("add"), "Sum": _binary("add"), "Sub": _binary("sub"), "Mul": _binary("mul"),
    "Div": _binary("div", floating_only=True), "Pow": _binary("pow", floating_only=True), "Max": _binary("maximum"),
    "Min": _binary("minimum"), "Where": lambda im, n: Term(
        "where", (im.term(n.input[0]), im.operand(n.input[1], n.input[2]), im.operand(n.input[2], n.input[1]))),
    # the ops that declare one ONNX operator of one input and no attributes as their own
    **{op.onnx: _unary(op.name) for op in OPS.values() if op.arity == 1 and not op.attrs and op.onnx[:1].isupper()},
    "Reciprocal": lambda im, n: Term("div", (Term.const(1.0), im.term(n.input[0]))),
    "Gelu": lambda im, n: Term("gelu", (im.term(n.input[0]),), (_attr(n, "approximate", "none"),)),
    "Identity": lambda im, n: im.term(n.input[0]), "Dropout": _dropout, "ReduceSum": _reduce("sum"),
    "ReduceMean": _reduce("mean"), "ReduceMax": _reduce("max"), "ReduceLogSumExp": _reduce("logsumexp"),
    "MatMul": lambda im, n: Term("matmul", (im.term(n.input[0]), im.term(n.input[1]))), "Gemm": _gemm,
    "Transpose": _transpose, **dict.fromkeys(("Reshape", "Flatten", "Squeeze", "Unsqueeze"), _to_shape("reshape")),
    "Expand": _to_shape("expand"), "Gather": _gather("index_select"),
    "GatherElements": _gather("gather"), "Concat": _concat,
    "Slice": _slice, "Cast": _cast, "Softmax": _softmax("softmax"),
    "LogSoftmax": _softmax("log_softmax"), "LayerNormalization": _norm("layer_norm"),
    "RMSNormalization": _norm("rms_norm"), "Conv": _conv, "MaxPool": _max_pool, "BatchNormalization": _batch_norm,
    "NegativeLogLikelihoodLoss": _class_loss("nll_loss"), "SoftmaxCrossEntropyLoss": _class_loss("cross_entropy")}
