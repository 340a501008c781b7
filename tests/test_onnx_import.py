"""ONNX operators into Terms: each case is one node, imported into the op it should become (or
kept opaque where no Term is exact), then optimized, exported and compared under onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from egraph_opt.backends.onnx_backend import export
from egraph_opt.drivers.onnx_batch import random_feeds, session
from egraph_opt.validate import judge
from egraph_opt.frontends.onnx_frontend import import_model
from egraph_opt.optimization.pipeline import optimize

_rng = np.random.default_rng(0)


def _init(name, *shape, positive=False):
    a = _rng.standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name)


_TARGETS = numpy_helper.from_array(np.array([0, 2, 1, 2], dtype=np.int64), "t")  # class indices
#: name -> (node, input shape, output shape, initializers, op of the output term or "opaque")
CASES = {
    "softplus": (helper.make_node("Softplus", ["x"], ["y"]), (2, 4), (2, 4), [], "softplus"),
    "gemm_transB_is_linear": (helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1),
                              (3, 4), (3, 5), [_init("w", 5, 4), _init("b", 5)], "linear"),
    "gemm_with_matrix_bias": (helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1),
                              (3, 4), (3, 5), [_init("w", 5, 4), _init("b", 3, 5)], "add"),
    "gemm_scaled": (helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=0.5),
                    (3, 4), (3, 5), [_init("w", 5, 4), _init("b", 5)], "add"),
    "layer_norm_without_bias": (helper.make_node("LayerNormalization", ["x", "s"], ["y"]),
                                (2, 3, 4), (2, 3, 4), [_init("s", 4)], "layer_norm"),
    "rms_norm": (helper.make_node("RMSNormalization", ["x", "s"], ["y"], epsilon=1e-6),
                 (2, 3, 4), (2, 3, 4), [_init("s", 4)], "rms_norm"),
    "conv": (helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 0, 1, 0], strides=[2, 1]),
             (1, 3, 6, 6), (1, 4, 3, 4), [_init("w", 4, 3, 3, 3), _init("b", 4)], "conv2d"),
    "conv_without_bias_grouped": (helper.make_node("Conv", ["x", "w"], ["y"], group=3,
                                                   dilations=[2, 2]), (1, 3, 6, 6), (1, 3, 2, 2), [_init("w", 3, 1, 3, 3)], "conv2d"),
    "conv_asymmetric_pads": (helper.make_node("Conv", ["x", "w"], ["y"], pads=[0, 0, 1, 1]),
                             (1, 3, 6, 6), (1, 4, 6, 6), [_init("w", 4, 3, 2, 2)], "opaque"),
    "conv_same_padding": (helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER"),
                          (1, 3, 6, 6), (1, 4, 6, 6), [_init("w", 4, 3, 2, 2)], "opaque"),
    "max_pool": (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1]), (1, 3, 6, 6), (1, 3, 3, 3), [], "max_pool2d"),
    "max_pool_ceil_mode": (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2],
                                            strides=[2, 2], ceil_mode=1),
                           (1, 3, 5, 5), (1, 3, 3, 3), [], "opaque"),
    "batch_norm": (helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3),
                   (2, 3, 4, 4), (2, 3, 4, 4),
                   [_init("s", 3), _init("b", 3), _init("m", 3), _init("v", 3, positive=True)],
                   "batch_norm"),
    "softmax_cross_entropy": (helper.make_node("SoftmaxCrossEntropyLoss", ["x", "t"], ["y"], ignore_index=1),
                              (4, 3), (), [_TARGETS], "cross_entropy"),
    "nll_loss_per_sample": (helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], reduction="none"),
                            (4, 3), (4,), [_TARGETS], "nll_loss"),
    "nll_loss_weighted": (helper.make_node("NegativeLogLikelihoodLoss", ["x", "t", "w"], ["y"]),
                          (4, 3), (), [_TARGETS, _init("w", 3, positive=True)], "opaque"),
}
#: cases whose operator is newer than opset 17
OPSET = {"rms_norm": 23}


def _model(case: str) -> onnx.ModelProto:
    node, x_shape, y_shape, inits, _ = CASES[case]
    graph = helper.make_graph([node], case,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET.get(case, 17))],
                             ir_version=10)


@pytest.mark.parametrize("case", CASES)
def test_import_then_export_matches_onnxruntime(case):
    model = _model(case)
    src = import_model(model)
    (out,) = src.program.outputs
    assert out.op == CASES[case][-1]
    optimized = export(src, optimize(src.program).program)
    onnx.checker.check_model(optimized, full_check=True)
    feeds = random_feeds(model)
    (expected,), (got,) = session(model).run(None, feeds), session(optimized).run(None, feeds)
    assert judge(got, expected)[0], judge(got, expected)


def _merged_swap(split_to: list[int]) -> onnx.ModelProto:
    """x (2, 3, 4, 5): leading dims merged (6, 4, 5), last two swapped, reshaped to ``split_to``."""
    shapes = {"merged": np.array([6, 4, 5], np.int64), "split": np.array(split_to, np.int64)}
    nodes = [helper.make_node("Reshape", ["x", "merged"], ["m"]),
             helper.make_node("Transpose", ["m"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["t", "split"], ["y"])]
    graph = helper.make_graph(nodes, "swap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, split_to)],
                              [numpy_helper.from_array(a, n) for n, a in shapes.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


@pytest.mark.parametrize("split_to,op,operand", [([2, 3, 5, 4], "transpose", "input"),
                                                 ([3, 2, 5, 4], "transpose", "reshape"), ([6, 20], "reshape", "transpose")])
def test_leading_dims_merged_swapped_and_split_back_import_as_one_transpose(split_to, op, operand):
    """The dynamo exporter's K^T over heads is x.transpose(-2, -1) where the split restores x's
    leading dims, and x viewed with the split's leading dims, swapped, where it splits them
    otherwise (3, 2; grouped-query K merged from (B, Hkv, G)); a split of the last two is neither."""
    model = _merged_swap(split_to)
    src = import_model(model)
    (out,) = src.program.outputs
    assert out.op == op and out.args[0].op == operand
    feeds = random_feeds(model)
    (expected,), (got,) = session(model).run(None, feeds), session(export(src, src.program)).run(None, feeds)
    np.testing.assert_array_equal(got, expected)


def test_an_initializer_listed_as_an_input_stays_an_input_a_caller_may_override():
    """onnxruntime lets a feed replace an initializer the graph also lists as an input: the
    optimized model keeps that input and its default, and computes with a fed value (the
    initializer was folded as a constant and dropped from the inputs: feeding it failed)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Mul", ["h", "s"], ["hs"]),
             helper.make_node("Softplus", ["hs"], ["y"])]
    inits = [_init("w", 4, 4), numpy_helper.from_array(np.array(2.0, np.float32), "s")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
              helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 4]),
              helper.make_tensor_value_info("s", TensorProto.FLOAT, [])]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [3, 4])], inits), opset_imports=[helper.make_opsetid("", 17)], ir_version=10,
        doc_string="the model's own description")
    optimized = export(import_model(model), optimize(import_model(model).program).program)
    assert optimized.doc_string == model.doc_string
    assert [i.name for i in optimized.graph.input] == ["x", "w", "s"]
    assert {"w", "s"} <= {t.name for t in optimized.graph.initializer}
    x = random_feeds(model)["x"]
    for feeds in ({"x": x}, {"x": x, "w": -numpy_helper.to_array(inits[0]), "s": np.array(-0.5, np.float32)}):
        (expected,), (got,) = session(model).run(None, feeds), session(optimized).run(None, feeds)
        assert judge(got, expected)[0], (sorted(feeds), judge(got, expected))
