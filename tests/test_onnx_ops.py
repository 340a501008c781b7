"""Every op of the op table exports to ONNX and computes, under onnxruntime, what its torch
implementation computes; or it is named in ``NO_ONNX_FORM``. A new op without either fails here.

Each op has samples (operands and attributes) in ``SAMPLES``; each sample is exported at opset 17
(decompositions: Gelu, Attention) and 23 (the standard operators) and run on fixed inputs.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

from egraph_opt.backends import onnx_backend
from egraph_opt.backends.onnx_backend import EMIT, NO_ONNX_FORM, OnnxExportError, export
from egraph_opt.drivers.onnx_batch import session
from egraph_opt.validate import judge
from egraph_opt.frontends.onnx_converters import ELEM_TYPES, ValueType
from egraph_opt.frontends.onnx_frontend import GraphProgram, OnnxProgram
from egraph_opt.lang.ops import OPS, parse_shape
from egraph_opt.lang.term import Term, evaluate, postorder, shapes

_rng = np.random.default_rng(0)
FEEDS = {
    "x": _rng.uniform(-2, 2, (2, 3, 4)).astype(np.float32),
    "p": _rng.uniform(0.5, 2, (2, 3, 4)).astype(np.float32),
    "m": _rng.random((2, 3, 4)) < 0.5,
    **{n: _rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for n in "qkv"},
    "img": _rng.standard_normal((2, 3, 6, 6)).astype(np.float32),
    "keep": np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=bool),
}
PARAMS = {
    "w": torch.randn(4, 5), "lin_w": torch.randn(5, 4), "lin_b": torch.randn(5),
    "ln_w": torch.randn(4), "ln_b": torch.randn(4),
    "idx": torch.randint(0, 4, (2, 3, 4)), "sel": torch.tensor([3, 0]),
    "mask": torch.triu(torch.full((4, 4), -torch.inf), 1),
    "dead": torch.tensor([[0.0, -torch.inf, 0.0, 0.0], [-torch.inf] * 4, [0.0] * 4, [0.0] * 4]),
    "cw": torch.randn(4, 3, 3, 3), "cb": torch.randn(4), "gw": torch.randn(3, 1, 3, 3),
    "mean": torch.randn(3), "var": torch.rand(3) + 0.5, "gamma": torch.randn(3), "beta": torch.randn(3),
    "cos": torch.randn(4, 8), "sin": torch.randn(4, 8),  # rotary tables of q's (T, D)
    "classes": torch.tensor([[0, 2, -100, 1], [1, 1, 0, 2]]),  # of x's 3 classes (axis 1), one ignored
    "classes-2": torch.tensor([[0, 2, 2, 1], [1, 1, 0, 0]]),  # the same, class 2 ignored
}


def _leaf(name: str) -> Term:
    if name in FEEDS:
        a = FEEDS[name]
        return Term.input(name, a.shape, "bool" if a.dtype == bool else str(a.dtype))
    t = PARAMS[name]
    return Term("param", (), (name, ",".join(map(str, t.shape)), str(t.dtype).removeprefix("torch.")))


x, p, m, q, k, v, img = (_leaf(n) for n in ("x", "p", "m", "q", "k", "v", "img"))
c = Term.const
_CONV = ("1,1", "1,1", "1,1", 1)
#: op -> samples of (operands, attributes)
SAMPLES: dict[str, list[tuple[tuple, tuple]]] = {
    **{op: [((x, p), ())] for op in ("add", "sub", "mul", "div", "maximum", "minimum", "logaddexp")},
    "pow": [((p, x), ()), ((x, c(3.0)), ())],
    "where": [((m, x, p), ()), ((m, c(0.0), c(-2.0)), ())],
    "less": [((x, p), ()), ((x, c(0.5)), ())],
    "isnan": [((Term("log", (x,)),), ())],
    "logical_not": [((Term("isnan", (Term("log", (x,)),)),), ())],
    **{op: [((x,), ())] for op in ("neg", "exp", "expm1", "abs", "sin", "cos", "tanh", "sigmoid",
                                   "relu", "erf", "softplus", "tan", "atan", "asinh", "cbrt", "silu",
                                   "floor", "ceil", "round", "sinh", "cosh")},
    **{op: [((Term("mul", (x, c(0.25))),), ())] for op in ("asin", "acos")},
    **{op: [((x, p), ()), ((p, x), ())] for op in ("atan2", "hypot")},
    "acosh": [((Term("add", (p, c(1.0))),), ())], "atanh": [((Term("mul", (x, c(0.01))),), ())],
    **{op: [((p,), ())] for op in ("log", "log1p", "sqrt", "rsqrt")},
    "gelu": [((x,), ("none",)), ((x,), ("tanh",))],
    "swish": [((x,), (1.702,)), ((x,), (-0.5,))],
    "geglu": [((x, p), ("none",)), ((x, p), ("tanh",))],
    "rotary": [((q, _leaf("cos"), _leaf("sin")), ())],
    **{op: [((x, _leaf(t)), (r, i)) for r in ("mean", "sum", "none") for t, i in (("classes", -100),
                                                                                   ("classes-2", 2))]
       for op in ("nll_loss", "cross_entropy")},
    **{op: [((x,), (-1, True)), ((x,), (-2, False))] for op in ("sum", "compensated_sum", "max", "mean", "logsumexp")},
    "var": [((x,), (-1, True, 0)), ((x,), (-2, False, 1))],
    "matmul": [((x, _leaf("w")), ())],
    "transpose": [((x,), (-2, -1)), ((x,), (-3, -1))],
    "permute": [((x,), ("2,0,1",))],
    "reshape": [((x,), ("6,4",))],
    "expand": [((x,), ("3,2,3,4",))],
    "gather": [((x, _leaf("idx")), (-1,))],
    "index_select": [((x, _leaf("sel")), (-1,))],
    "slice": [((x,), (-1, 1, 4, 2))],
    "concat": [((x, p), (-1,))],
    "cast": [((x,), ("float64",)), ((x,), ("float16",))],
    "softmax": [((x,), (-1,))],
    "log_softmax": [((x,), (-2,))],
    "layer_norm": [((x, _leaf("ln_w"), _leaf("ln_b")), (1e-5,)), ((x, c(1.0), c(0.0)), (1e-5,)),
                   ((x, c(2.0), c(0.5)), (1e-3,)), ((x, _leaf("ln_w"), c(0.0)), (1e-5,))],
    "rms_norm": [((x, _leaf("ln_w")), (1e-5,)), ((x, c(1.0)), (1e-6,)), ((x, c(2.0)), (1e-3,))],
    "sdpa": [((q, k, v), (0.35, False)), ((q, k, v), (1.0, True))],
    "sdpa_masked": [((q, k, v, _leaf("mask")), (0.35,))],
    "sdpa_guarded": [((q, k, v, _leaf("mask")), (0.35,)), ((q, k, v, _leaf("dead")), (0.35,))],
    "sdpa_filled": [((q, k, v, _leaf("keep")), (0.35, -3.4028234663852886e38))],
    "sdpa_filled_biased": [((q, k, v, _leaf("keep"), _leaf("mask")), (0.35, -3.4028234663852886e38))],
    "sdpa_filled_then_biased": [((q, k, v, _leaf("keep"), _leaf("mask")), (0.35, -3.4028234663852886e38))],
    "sdpa_floored": [((q, k, v, _leaf("mask")), (0.35, -3.4028234663852886e38)),
                     ((q, k, v, _leaf("dead")), (0.35, -1.0))],
    "linear": [((x, _leaf("lin_w"), _leaf("lin_b")), ())],
    "linear_act": [((x, _leaf("lin_w"), _leaf("lin_b")), (a,)) for a in ("relu", "gelu", "gelu_tanh")],
    "linear_add": [((x, _leaf("lin_w"), _leaf("lin_b"), r), ())
                   for r in (_leaf("lin_b"), Term("linear", (x, _leaf("lin_w"), _leaf("lin_b"))))],
    "linear_scaled": [((x, _leaf("lin_w"), _leaf("lin_b")), (s,)) for s in (0.5, -4.0)],
    "conv2d": [((img, _leaf("cw"), _leaf("cb")), ("2,1", "1,0", "1,1", 1)),
               ((img, _leaf("cw"), c(0.0)), _CONV), ((img, _leaf("cw"), c(0.5)), _CONV),
               ((img, _leaf("gw"), c(0.0)), ("1,1", "0,0", "2,2", 3))],
    "max_pool2d": [((img,), ("2,2", "2,2", "0,0", "1,1")), ((img,), ("3,2", "2,1", "1,0", "1,2"))],
    "batch_norm": [((img, *(_leaf(n) for n in ("mean", "var", "gamma", "beta"))), (1e-5,))],
}
_CASES = [pytest.param(op, i, opset, id=f"{op}-{i}-opset{opset}")
          for op, samples in SAMPLES.items() for i in range(len(samples)) for opset in (17, 23)]


def single_term_model(term: Term, opset: int, symbolic: bool = False) -> OnnxProgram:
    """An OnnxProgram computing ``term`` from its inputs, as if imported (optionally with every
    input dim symbolic)."""
    inputs = [u for u in postorder([term]) if u.op == "input"]
    params = {u.attrs[0]: PARAMS[u.attrs[0]] for u in postorder([term]) if u.op == "param"}
    shape, dtype = shapes([term])[id(term)]
    types = {u.attrs[0]: ValueType(ELEM_TYPES[u.attrs[2]], tuple(
        f"d{i}" if symbolic else d for i, d in enumerate(parse_shape(u.attrs[1])))) for u in inputs}
    elem = ELEM_TYPES[str(dtype).removeprefix("torch.")]
    graph = helper.make_graph(
        [], "g", [helper.make_tensor_value_info(n, vt.elem_type, list(vt.shape)) for n, vt in types.items()],
        [helper.make_tensor_value_info("y", elem, list(shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return OnnxProgram(program=GraphProgram(tuple(inputs), (term,), {}, params), model=model, types=types,
                       tensors={}, output_names=("y",))


def test_every_op_exports_or_is_declared_without_onnx_form():
    ops = {name for name, op in OPS.items() if not op.is_leaf}
    unwritten = {name: OPS[name].onnx for name in ops - NO_ONNX_FORM if OPS[name].onnx not in EMIT}
    assert not unwritten, f"ops declare ONNX forms no emitter writes: {unwritten}"
    assert set(EMIT) <= {op.onnx for op in OPS.values()}, "EMIT writes forms no op declares"
    assert set(SAMPLES) == ops - NO_ONNX_FORM, "every exportable op needs a numeric sample here"


@pytest.mark.parametrize("op, index, opset", _CASES)
def test_op_matches_its_torch_implementation_under_onnxruntime(op, index, opset):
    args, attrs = SAMPLES[op][index]
    term = Term(op, args, attrs)
    model = export(single_term_model(term, opset))
    onnx.checker.check_model(model, full_check=True)
    feeds = {i.name: FEEDS[i.name] for i in model.graph.input}
    (got,) = session(model).run(None, feeds)
    env = {**{n: torch.from_numpy(a) for n, a in feeds.items()}, **PARAMS}
    expected = evaluate([term], env)[0].numpy()
    assert judge(got, expected)[0], judge(got, expected)
    assert op not in {"sdpa", "sdpa_masked"} or opset < 23 or \
        [n.op_type for n in model.graph.node] == ["Attention"]


def test_an_op_without_onnx_form_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(onnx_backend, "NO_ONNX_FORM", frozenset({"softplus"}))
    with pytest.raises(OnnxExportError, match="^op 'softplus' has no ONNX form$"):
        export(single_term_model(Term("softplus", (x,)), 17))


@pytest.mark.parametrize("term, message", [
    (Term("var", (x,), (-1, True, 1)), "var with a correction over a dynamic shape"),
    (Term("sdpa", (q, k, v), (1.0, True)), "causal attention over dynamic lengths"),
])
def test_forms_that_need_static_shapes_refuse_dynamic_ones(term, message):
    with pytest.raises(OnnxExportError, match=message):
        export(single_term_model(term, 17, symbolic=True))


def test_product_by_a_canonicalized_reciprocal_goes_back_to_the_division():
    sqrt2 = float(np.float32(np.sqrt(2)))
    model = export(single_term_model(Term("mul", (x, c(1 / sqrt2))), 17))
    assert [n.op_type for n in model.graph.node] == ["Div"]
    divisor = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer
                                              if i.name == model.graph.node[0].input[1]))
    assert divisor == np.float32(sqrt2)
    model = export(single_term_model(Term("mul", (x, c(0.5))), 17))  # a constant the model stores
    assert [n.op_type for n in model.graph.node] == ["Mul"]


@pytest.mark.parametrize("op", ["log1p", "expm1"])
def test_log1p_and_expm1_stay_accurate_under_onnxruntime(op):
    """ONNX has neither op; their emitted forms must keep what the rewrite to them gained: every
    digit of a tiny x (log(1 + x) and exp(x) - 1 lose them all), and no inf / inf at large x."""
    values = np.array([1e-30, -3e-12, 1e-7, -2e-4, 0.3, -0.9, 5.0, 60.0, 88.0, -100.0, 0.0],
                      dtype=np.float32).reshape(1, 11)
    leaf = Term.input("x", values.shape, "float32")
    model = export(single_term_model(Term(op, (leaf,)), 17))
    (got,) = session(model).run(None, {"x": values})
    truth = getattr(torch, op)(torch.from_numpy(values).double()).numpy()
    np.testing.assert_allclose(got, truth, rtol=4e-7, atol=0)
