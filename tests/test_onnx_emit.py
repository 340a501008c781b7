"""What the ONNX backend writes for onnxruntime to run fast: no flattening around a MatMul, and
residual adds before a LayerNormalization that onnxruntime does not fuse into its (slower)
SkipLayerNormalization. Each case also computes what the original does."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from egraph_opt.backends.onnx_backend import export
from egraph_opt.drivers.onnx_batch import random_feeds, session
from egraph_opt.frontends.onnx_frontend import import_model
from egraph_opt.optimization.pipeline import optimize
from egraph_opt.validate import judge


def _model(nodes, inputs, output, initializers, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                           for n, s in inputs],
                              [helper.make_tensor_value_info(output[0], TensorProto.FLOAT, output[1])],
                              [numpy_helper.from_array(a, n) for n, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _optimized(model):
    src = import_model(model)
    out = export(src, optimize(src.program).program)
    onnx.checker.check_model(out, full_check=True)
    feeds = random_feeds(model, seed=2)
    (expected,), (got,) = session(model).run(None, feeds), session(out).run(None, feeds)
    assert judge(got, expected)[0]
    return [n.op_type for n in out.graph.node]


def _flattened_matmul(unflat, bias=None):
    """x (2, 3, 4) viewed as (6, 4), times w (4, 5) (plus ``bias``'s shape of random values),
    viewed as ``unflat``."""
    rng = np.random.default_rng(0)
    values = {"w": rng.standard_normal((4, 5)).astype(np.float32), "flat": np.array([6, 4]),
              "unflat": np.array(unflat)}
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["f"]), helper.make_node("MatMul", ["f", "w"], ["m"])]
    if bias is not None:
        values["b"] = rng.standard_normal(bias).astype(np.float32)
        nodes.append(helper.make_node("Add", ["m", "b"], ["mb"]))
    nodes.append(helper.make_node("Reshape", [nodes[-1].output[0], "unflat"], ["y"]))
    return _model(nodes, [("x", [2, 3, 4])], ("y", list(unflat)), values)


@pytest.mark.parametrize("bias", [None, (5,), (1,)])
def test_matmul_between_a_flattening_and_its_undoing_is_one_matmul(bias):
    ops = _optimized(_flattened_matmul((2, 3, 5), bias))
    assert ops[0] == "MatMul" and len(ops) == (2 if bias else 1)  # the bias: an Add or a Sub


@pytest.mark.parametrize("unflat,bias", [((3, 2, 5), None), ((6, 5, 1), None), ((30,), None),
                                         ((2, 3, 5), (6, 5))])
def test_other_views_of_the_product_keep_their_reshapes(unflat, bias):
    """Rows regrouped otherwise than x's leading axes, the last axis not w's, or a bias per row
    (which would broadcast otherwise over x's axes): not MatMul(x, w)."""
    assert "Reshape" in _optimized(_flattened_matmul(unflat, bias))


def _residual_norm(also_read: bool):
    """LayerNormalization(x + r), the sum also read by an Exp when ``also_read``."""
    c = 8
    nodes = [helper.make_node("Add", ["x", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["n"], axis=-1, epsilon=1e-5)]
    if also_read:
        nodes += [helper.make_node("Exp", ["s"], ["e"]), helper.make_node("Add", ["n", "e"], ["y"])]
    else:
        nodes[-1].output[0] = "y"
    rng = np.random.default_rng(1)
    return _model(nodes, [("x", [2, 4, c]), ("r", [2, 4, c])], ("y", [2, 4, c]),
                  {"g": rng.standard_normal(c).astype(np.float32),
                   "b": rng.standard_normal(c).astype(np.float32)})


def test_add_read_only_by_layer_norm_is_written_as_sum():
    ops = _optimized(_residual_norm(also_read=False))
    assert ops == ["Sum", "LayerNormalization"]
    written = export(import_model(_residual_norm(also_read=False)))
    assert "Sum" in [n.op_type for n in written.graph.node]
    assert not import_model(written).program.opaque  # it imports again: Sum is an addition


def test_add_read_elsewhere_too_stays_add():
    ops = _optimized(_residual_norm(also_read=True))
    assert "Sum" not in ops and ops.count("Add") == 2


def _log_of_one_plus(folder) -> str:
    """log(1 + x) over 512 x 512: the rewrite to log1p writes Kahan's form, seven ONNX nodes
    (onnxruntime runs it 2-3x slower than Add and Log), and buys accuracy for tiny x."""
    nodes = [helper.make_node("Add", ["x", "one"], ["u"]), helper.make_node("Log", ["u"], ["y"])]
    path = str(folder / "log1p.onnx")
    onnx.save(_model(nodes, [("x", [512, 512])], ("y", [512, 512]), {"one": np.array(1, np.float32)}),
              path)
    return path


@pytest.mark.parametrize("objective,kept", [("latency", True), ("stability", False)])
def test_a_model_measured_slower_is_written_as_it_was(tmp_path, objective, kept):
    """Unless the objective asks for the stability it buys (the decorator's rule)."""
    from egraph_opt.drivers.onnx_batch import process
    path, target = _log_of_one_plus(tmp_path), str(tmp_path / "out.onnx")
    r = process(path, target, {"force": True, "objective": objective, "seed": 0, "latency_runs": 9,
                               "profile_db": str(tmp_path / "p.sqlite"), "profile_budget": 0})
    assert r["status"] == "optimized" and r["rewrites"] == {"log1p-from-log": 1}
    assert ("kept_original" in r) == kept
    written = [n.op_type for n in onnx.load(target).graph.node]
    assert (written == ["Add", "Log"]) == kept
    from egraph_opt.drivers.onnx_batch import line, summary
    if kept:  # what the report says agrees with what was measured: the ratio, and the original kept
        ratio = r["latency_ms_optimized"] / r["latency_ms_before"]
        assert f"{ratio:.2f}x as long" in line(r) and "kept original" in summary([r]).splitlines()[1]
    else:  # written though slower: the line says so and why
        assert ("slower" in r) == (r["latency_ms_after"] > r["latency_ms_before"])
        assert "slower" not in r or "kept for the stability" in line(r)


def _split_product(axis=-1, sizes=None, bias=None, also_read=False):
    """x (2, 3, 4) @ w (4, 6) (+ b of shape ``bias``), split in two along ``axis`` and put back swapped (plus the
    product itself when ``also_read``)."""
    rng = np.random.default_rng(3)
    values = {"w": rng.standard_normal((4, 6)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"])]
    if bias:
        values["b"] = rng.standard_normal(bias).astype(np.float32)
        nodes.append(helper.make_node("Add", ["p", "b"], ["pb"]))
    inputs = [nodes[-1].output[0]] + (["sizes"] if sizes else [])
    if sizes:
        values["sizes"] = np.array(sizes)
    nodes += [helper.make_node("Split", inputs, ["s0", "s1"], axis=axis, **({} if sizes else {"num_outputs": 2})),
              helper.make_node("Concat", ["s1", "s0"], ["y"], axis=axis)]
    if also_read:
        nodes[-1].output[0] = "c"
        nodes.append(helper.make_node("Add", ["c", "p"], ["y"]))
    return _model(nodes, [("x", [2, 3, 4])], ("y", [2, 3, 6]), values, opset=18)


@pytest.mark.parametrize("sizes,bias", [(None, None), ((2, 4), None), (None, (6,))])
def test_split_of_a_product_by_stored_weights_is_a_product_per_part(sizes, bias):
    ops = _optimized(_split_product(sizes=sizes, bias=bias))
    assert "Split" not in ops and ops.count("MatMul") == 2


@pytest.mark.parametrize("axis,also_read,bias", [(0, False, None), (1, False, None), (-1, True, None),
                                              (-1, False, (1, 6))])
def test_a_split_along_another_axis_of_a_product_read_elsewhere_or_biased_by_rows_stays(axis, also_read,
                                                                                         bias):
    """Not along w's columns, the product needed whole, or a bias not one value per column."""
    assert "Split" in _optimized(_split_product(axis=axis, also_read=also_read, bias=bias))


def test_a_models_misses_are_timed_once_and_its_record_counts_them(tmp_path):
    """Misses are profiled within the budget and kept: the same model again times nothing."""
    from egraph_opt.drivers.onnx_batch import process
    path = _log_of_one_plus(tmp_path)
    options = {"force": True, "objective": "balanced", "seed": 0, "latency_runs": 0,
               "profile_db": str(tmp_path / "p.sqlite"), "profile_budget": 30}
    first, again = (process(path, str(tmp_path / f"out{i}.onnx"), options) for i in range(2))
    assert first["status"] == again["status"] == "optimized"
    assert first["kernels_profiled"] > 0 and again["kernels_profiled"] == 0


def _rotate_half(repeated: bool):
    """x cos + rotate_half(x) sin over x (1, 2, 8, 16), cos and sin stored (1, 1, 8, 16): their
    halves equal (transformers' cat(freqs, freqs)) or not."""
    rng = np.random.default_rng(0)
    angles = rng.standard_normal((8, 8 if repeated else 16)).astype(np.float32)
    tables = {n: np.tile(f(angles), (1, 2) if repeated else (1, 1))[None, None] for n, f in (("cos", np.cos), ("sin", np.sin))}
    ints = {n: np.array([v], np.int64) for n, v in (("zero", 0), ("half", 8), ("end", 16), ("last", -1))}
    nodes = [helper.make_node("Mul", ["x", "cos"], ["a"]),
             helper.make_node("Slice", ["x", "zero", "half", "last"], ["x1"]),
             helper.make_node("Slice", ["x", "half", "end", "last"], ["x2"]),
             helper.make_node("Neg", ["x2"], ["n"]), helper.make_node("Concat", ["n", "x1"], ["r"], axis=-1),
             helper.make_node("Mul", ["r", "sin"], ["b"]), helper.make_node("Add", ["a", "b"], ["y"])]
    return _model(nodes, [("x", [1, 2, 8, 16])], ("y", [1, 2, 8, 16]), {**tables, **ints}, opset=23)


@pytest.mark.parametrize("repeated", [True, False])
def test_rotate_half_is_rotary_embedding_only_where_the_stored_halves_repeat(repeated):
    ops = _optimized(_rotate_half(repeated))
    assert ("RotaryEmbedding" in ops) == repeated


def _bmm_attention(split_to: list[int]):
    """softmax(q k^T * 0.5 + alibi) v as torch's baddbmm writes it over (B * H, T, D) merges of
    q, k (1, 2, 8, 4), its scores split to ``split_to``."""
    rng = np.random.default_rng(1)
    values = {"merged": np.array([2, 8, 4]), "split": np.array(split_to), "half": np.array(0.5, np.float32),
              "alibi": rng.standard_normal((2, 1, 8)).astype(np.float32)}
    nodes = [helper.make_node("Reshape", ["q", "merged"], ["qm"]), helper.make_node("Reshape", ["k", "merged"], ["km"]),
             helper.make_node("Transpose", ["km"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["qm", "kt"], ["s"]), helper.make_node("Mul", ["s", "half"], ["scaled"]),
             helper.make_node("Add", ["scaled", "alibi"], ["biased"]),
             helper.make_node("Reshape", ["biased", "split"], ["heads"]),
             helper.make_node("Softmax", ["heads"], ["w"], axis=-1), helper.make_node("MatMul", ["w", "v"], ["y"])]
    v = split_to[:2] + [8, 4]
    return _model(nodes, [("q", [1, 2, 8, 4]), ("k", [1, 2, 8, 4]), ("v", v)], ("y", v), values, opset=23)


@pytest.mark.parametrize("split_to,fused", [([1, 2, 8, 8], True), ([2, 1, 8, 8], False)])
def test_bmm_over_merged_heads_is_attention_where_the_split_restores_them(split_to, fused):
    """The 3-D product of (B * H, T, D) merges, scaled and biased by a (B * H, 1, T) constant, split
    back to (B, H, T, T) is the 4-D product (one Attention); split otherwise, it is left alone."""
    assert ("Attention" in _optimized(_bmm_attention(split_to))) == fused


def test_a_fill_where_a_mask_is_set_is_one_where_as_written():
    """masked_fill(mask == 0, -1e9) before a softmax fuses (sdpa_filled keeps the keys not
    masked); written back it is the Where it was, no Not beside it."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Equal", ["mask", "zero"], ["masked"]),
             helper.make_node("Where", ["masked", "fill", "s"], ["filled"]),
             helper.make_node("Softmax", ["filled"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    inits = {"mask": np.tril(np.ones((1, 8, 8), np.float32)), "zero": np.array(0.0, np.float32),
             "fill": np.array(-1e9, np.float32)}
    ops = _optimized(_model(nodes, [(n, [1, 8, 4]) for n in "qkv"], ("y", [1, 8, 4]), inits))
    assert "Not" not in ops and ops.count("Where") == 1, ops
