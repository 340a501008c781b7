"""On the ONNX path the original runs in float32 under onnxruntime; where it overflows, the float64
reference of its (faithful) import judges, as in the decorator, so a stability fix is accepted as
fixed rather than refused for differing from the original's NaNs."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from egraph_opt.drivers.onnx_batch import process, random_feeds, session
from egraph_opt.frontends.onnx_frontend import import_model
from egraph_opt.validate import imported_reference


def _naive_softmax(scale: float) -> onnx.ModelProto:
    """softmax(scale * x) spelled exp / sum exp: at scale 100, exp overflows float32 on N(0, 1) inputs."""
    nodes = [helper.make_node("Mul", ["x", "s"], ["z"]), helper.make_node("Exp", ["z"], ["e"]),
             helper.make_node("ReduceSum", ["e", "axes"], ["t"], keepdims=1),
             helper.make_node("Div", ["e", "t"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array(scale, np.float32), "s"),
             onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    vec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 16]) for n in "xy"]
    return helper.make_model(helper.make_graph(nodes, "naive", vec[:1], vec[1:], inits),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _softmax64(x: np.ndarray, scale: float) -> np.ndarray:
    z = scale * x.astype(np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_a_model_whose_original_overflows_is_written_fixed(tmp_path):
    path, target = str(tmp_path / "naive.onnx"), str(tmp_path / "out.onnx")
    onnx.save(_naive_softmax(100.0), path)
    record = process(path, target, {"force": False, "objective": "balanced", "seed": 0,
                                    "latency_runs": 0, "profile_db": str(tmp_path / "p.sqlite"),
                                    "profile_budget": 0})
    assert record["status"] == "optimized", record["reason"]
    assert record["rewrites"] == {"softmax-fuse": 1}
    feeds = random_feeds(_naive_softmax(100.0), seed=0)
    (original,) = session(path).run(None, feeds)
    (fixed,) = session(target).run(None, feeds)
    assert np.isnan(original).any()  # the case: the original's NaNs
    np.testing.assert_allclose(fixed, _softmax64(feeds["x"], 100.0), atol=1e-6)


def test_an_import_that_does_not_reproduce_the_original_vouches_for_nothing():
    """The float64 reference judges only where the import, run in float32, gives what
    onnxruntime gave: else a wrong import would vouch for a candidate as wrong."""
    model = _naive_softmax(100.0)
    feeds = random_feeds(model, seed=0)
    expected = session(model).run(None, feeds)
    program = import_model(model).program
    (reference,) = imported_reference(program, feeds, expected)
    np.testing.assert_allclose(reference, _softmax64(feeds["x"], 100.0), rtol=1e-12)
    finite = np.isfinite(expected[0])
    changed = expected[0].copy()
    changed[finite] += 0.5  # a different original where it is finite
    assert imported_reference(program, feeds, [changed]) is None
    nans = expected[0].copy()
    nans[~finite] = np.inf  # or other non-finite values where it overflowed
    assert imported_reference(program, feeds, [nans]) is None
