"""Quick gelu, GeGLU, cross-entropy and rotary embedding (issue 17 item 2): the ops equal torch's
own spellings, torch's loss functions lower to them through fx and torch.export, and each guarded
fusion refuses what only looks like its pattern (the optimized program still equals the original).
Every spelling of bench/spellings.py fusing is tests/test_spellings.py's; ONNX forms are
tests/test_onnx_ops.py's."""
import math

import pytest
import torch
import torch.nn.functional as F

from egraph_opt import capture, saturate_and_extract
from egraph_opt.kernels.torch_ops import TORCH
from egraph_opt.lang.ops import OPS, log_softmax

from test_lowering_spellings import captured_equals_torch


def exported(fn):
    """fx cannot unpack a shape: the loss is captured through torch.export, as ATen."""
    def through_export(x, t):
        _, *_ = x.size()
        return fn(x, t)
    return through_export

REDUCTIONS = ("mean", "sum", "none")
gen = torch.Generator().manual_seed(0)
LOGITS = torch.randn(6, 5, generator=gen) * 3
TARGETS = torch.tensor([0, 4, -100, 2, 2, 1])


def ops_after(fn, *args, tol=1e-5):
    """The optimized program's ops, once it is checked to equal ``fn`` on ``args``."""
    f = saturate_and_extract(fn, profile_db=False)
    with torch.no_grad():
        torch.testing.assert_close(f(*args), fn(*args), rtol=tol, atol=tol, equal_nan=True)
    assert not f.report.fallback, f.report.fallback
    return f.report.ops_after


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(6, 5), (3, 5, 2)], ids=["rows", "class-axis-1"])
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_loss_ops_are_torchs_functions(reduction, shape, ignore_index):
    """ignore_index (-100 by default, or a real class), mean over the targets kept, sum, none."""
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    t = torch.randint(0, 5, (shape[0], *shape[2:]), generator=gen)
    t.view(-1)[1] = ignore_index
    options = dict(reduction=reduction, ignore_index=ignore_index)
    ce = TORCH["cross_entropy"](x, t, reduction, ignore_index)
    torch.testing.assert_close(ce, F.cross_entropy(x, t, **options), rtol=1e-12, atol=1e-12)
    nll = OPS["nll_loss"].impl(x, t, reduction, ignore_index)
    torch.testing.assert_close(nll, F.nll_loss(x, t, **options), rtol=0, atol=0)


def test_cross_entropy_keeps_log_softmax_semantics_at_inf_and_every_target_ignored():
    """Where torch's F.cross_entropy is NaN across a row with +inf, nll_loss(log_softmax) is +inf
    off the +inf logit: the fused op must equal the composition it replaces."""
    x = torch.tensor([[math.inf, 1.0, 2.0], [-math.inf, 1.0, 2.0], [math.nan, 1.0, 2.0], [1.0, 2.0, 3.0]])
    for reduction in REDUCTIONS:
        for t in (torch.tensor([0, 0, 1, 2]), torch.tensor([1, 0, 1, 2])):
            fused = TORCH["cross_entropy"](x, t, reduction, -100)
            composed = OPS["nll_loss"].impl(log_softmax(x, -1), t, reduction, -100)
            torch.testing.assert_close(fused, composed, equal_nan=True)
    assert TORCH["cross_entropy"](x, torch.full((4,), -100), "mean", -100).isnan()  # 0 / 0


NANOGPT_TARGETS = TARGETS.where(TARGETS >= 0, -1)  # nanoGPT marks positions without one by -1


@pytest.mark.parametrize("fn,targets", [
    (lambda x, t: F.cross_entropy(x, t), TARGETS),
    (lambda x, t: F.cross_entropy(x, t, reduction="sum", ignore_index=-1), NANOGPT_TARGETS),
    (lambda x, t: F.nll_loss(F.log_softmax(x, dim=1), t, reduction="none"), TARGETS),
    (exported(lambda x, t: F.cross_entropy(x, t)), TARGETS),
    (exported(lambda x, t: F.nll_loss(F.log_softmax(x, -1), t, reduction="sum")), TARGETS),
], ids=["fx", "fx-sum-ignore-minus-1", "fx-nll-none", "export-cross-entropy", "export-nll-sum"])
def test_losses_lower_from_fx_and_torch_export(fn, targets):
    """torch.export records F.cross_entropy as log_softmax and nll_loss_forward (loss, weight)."""
    program = captured_equals_torch(fn, LOGITS, targets, exact=False)
    assert {"cross_entropy", "nll_loss"} & {t.op for t in _terms(program)}
    assert "cross_entropy" in ops_after(fn, LOGITS, targets)


@pytest.mark.parametrize("fn", [
    lambda x, t: F.cross_entropy(x, t, weight=torch.linspace(0.5, 2, 5)),
    lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
    lambda x, t: F.cross_entropy(x, F.one_hot(t.clamp_min(0), 5).float()),  # probabilities
], ids=["class-weights", "label-smoothing", "probability-targets"])
def test_losses_the_op_does_not_mean_stay_opaque(fn):
    program, _ = capture(fn, (LOGITS, TARGETS))
    assert "cross_entropy" not in {t.op for t in _terms(program)}
    assert "cross_entropy" not in ops_after(fn, LOGITS, TARGETS)


def _terms(program):
    from egraph_opt.lang.term import postorder
    return postorder(program.roots())


def test_gathered_log_probabilities_of_t_none_become_cross_entropy_of_each_spelling():
    """-log(softmax).gather(t[:, None]), summed or averaged or per sample; gather reads the first
    len(t) rows only, which the fused loss keeps."""
    t = TARGETS.clamp_min(0)[:4]
    for reduce in (torch.mean, torch.sum, lambda v: v):
        fn = lambda x, t, r=reduce: -r(torch.log(torch.softmax(x, -1)).gather(-1, t[:, None]))  # noqa: E731
        assert "cross_entropy" in ops_after(fn, LOGITS, t), reduce


def test_gather_of_another_index_shape_is_no_cross_entropy():
    """cross-entropy-from-gather's guard: an index of shape (1, n) reads row 0 for every target."""
    t = TARGETS.clamp_min(0)
    after = ops_after(lambda x, t: -F.log_softmax(x, -1).gather(-1, t.view(1, -1)).mean(), LOGITS, t)
    assert "cross_entropy" not in after, after


def test_log_softmax_over_another_axis_than_the_classes_is_no_cross_entropy():
    """cross-entropy-fuse's guard: log_softmax over the batch axis is another function."""
    t = TARGETS.clamp_min(0)[:5]
    x = torch.randn(5, 5, generator=gen)
    after = ops_after(lambda x, t: F.nll_loss(F.log_softmax(x, dim=0), t), x, t)
    assert "cross_entropy" not in after, after


def _rotate(x, h):
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


Q = torch.randn(2, 3, 5, 8, generator=gen)
COS, SIN = torch.randn(5, 8, generator=gen), torch.randn(5, 8, generator=gen)


@pytest.mark.parametrize("fn", [
    lambda q, c, s: q * c + _rotate(q, 4) * s,
    lambda q, c, s: c * q + s * _rotate(q, 4),
    lambda q, c, s: (q[..., :4] * c[:, :4] + _rotate(q[..., :4], 2) * s[:, :4]),  # a partial rotary
], ids=["llama", "factors-first", "partial"])
def test_rotate_half_spellings_become_rotary(fn):
    assert ops_after(fn, Q, COS, SIN).get("rotary") == 1


@pytest.mark.parametrize("scale", [1.0, 1e38])  # 1e38: q's range reaches float32's largest value
def test_a_fused_rotary_is_no_steadier_than_its_spelled_form(scale):
    """Its sum of two rounded products cancels as the spelled add does, so a rotary measured
    slower does not pass as a stability gain (neox-partial-rotary kept one at 0.90x); and a range
    clipped at the dtype's largest value proves no finite result (Falcon's fused program priced an
    overflow its spelled form escaped)."""
    f = saturate_and_extract(lambda q, c, s: q * c + _rotate(q, 4) * s, profile_db=False,
                             input_ranges={"q": (-scale, scale), "c": (-1, 1), "s": (-1, 1)})
    with torch.no_grad():
        f(Q, COS.clamp(-1, 1), SIN.clamp(-1, 1))
    assert f.report.ops_after.get("rotary") == 1, f.report.ops_after
    before, after = f.report.cost_before, f.report.cost_after
    assert after["worst"] >= before["worst"] and after["cost"] < before["cost"], (before, after)


def test_rotation_by_other_than_half_is_no_rotary():
    """rotary-fuse's guard: cat(-x[..., 3:], x[..., :3]) of 8 is no rotate_half."""
    after = ops_after(lambda q, c, s: q * c + _rotate(q, 3) * s, Q, COS, SIN)
    assert "rotary" not in after, after


def test_rotary_takes_sin_sign_only_where_it_is_exact():
    """The cheaper form negates sin's half instead of x's: the same products, bit for bit; a sin
    broadcast along the last axis takes the plain form."""
    for cos, sin in ((COS, SIN), (COS, SIN[:, :1]), (COS.expand(2, 3, 5, 8), SIN.expand(2, 3, 5, 8))):
        want = Q * cos + _rotate(Q, 4) * sin
        torch.testing.assert_close(TORCH["rotary"](Q, cos, sin), want, rtol=0, atol=0)


def test_quick_gelu_is_a_swish_not_a_gelu():
    """x * sigmoid(1.702 x) is 2e-2 from gelu: it becomes swish(x, 1.702), exactly itself."""
    x = torch.randn(4, 16, generator=gen) * 3
    after = ops_after(lambda x: x * torch.sigmoid(1.702 * x), x, tol=0)
    assert after == {"swish": 1}, after
    after = ops_after(lambda x, y: x * torch.sigmoid(1.702 * y), x, x.flip(0))
    assert "swish" not in after, after


def test_gated_gelu_becomes_geglu_either_side():
    a, b = torch.randn(4, 16, generator=gen), torch.randn(4, 16, generator=gen)
    for fn in (lambda a, b: F.gelu(a) * b, lambda a, b: b * F.gelu(a, approximate="tanh")):
        assert ops_after(fn, a, b, tol=0) == {"geglu": 1}


def test_onnx_log_softmax_then_nll_loss_becomes_one_softmax_cross_entropy():
    """The same fusion on an imported model: LogSoftmax, NegativeLogLikelihoodLoss ->
    SoftmaxCrossEntropyLoss, equal under onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from egraph_opt.backends.onnx_backend import export
    from egraph_opt.drivers.onnx_batch import random_feeds, session
    from egraph_opt.frontends.onnx_frontend import import_model
    from egraph_opt.optimization.pipeline import optimize

    nodes = [helper.make_node("LogSoftmax", ["x"], ["lp"], axis=1),
             helper.make_node("NegativeLogLikelihoodLoss", ["lp", "t"], ["y"], ignore_index=1)]
    targets = numpy_helper.from_array(np.array([0, 2, 1, 2], dtype=np.int64), "t")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 3))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ())], [targets])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    src = import_model(model)
    optimized = export(src, optimize(src.program).program)
    assert [n.op_type for n in optimized.graph.node] == ["SoftmaxCrossEntropyLoss"]
    feeds = random_feeds(model)
    np.testing.assert_allclose(session(optimized).run(None, feeds)[0], session(model).run(None, feeds)[0],
                               rtol=1e-6)
