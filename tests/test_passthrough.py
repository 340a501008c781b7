"""Inputs at the edges of what a program takes (empty tensors, a NaN constant, train-mode modules,
meta tensors): the optimizer returns the original's results, optimized or run untouched with the
report saying why; never a traceback from inside the optimizer (issue 13)."""
import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from egraph_opt import saturate_and_extract
from egraph_opt.extractors.rounding_error import program_error
from egraph_opt.lang.program import Program
from egraph_opt.analysis.ranges import TOP, intervals
from egraph_opt.analysis.sampling import sample_inputs
from egraph_opt.lang.term import Term


def assert_same(got: torch.Tensor, want: torch.Tensor):
    """Equal shapes and dtypes, NaN where NaN, the same infinities, close elsewhere."""
    assert (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device)
    if got.device.type == "meta":
        return
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got.nan_to_num(nan=0.0), want.nan_to_num(nan=0.0), equal_nan=False,
                               atol=1e-5, rtol=1e-4)


def optimized(fn, *args, calls: int = 1):
    """fn optimized and called ``calls`` times on args (later calls run the cached plan): the last
    result and the report (a fallback warns; expected here)."""
    f = saturate_and_extract(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = [f(*args) for _ in range(calls)]
    return results[-1], f.report


EMPTY_PROGRAMS = {
    "exp-plus-one": lambda x: torch.exp(x) + 1,
    "naive-softmax": lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True),
    "log-sum-exp": lambda x: torch.log(torch.exp(x).sum(-1)),
    "sum-of-empty-axis": lambda x: torch.exp(x).sum(0),
    "one-pass-variance": lambda x: (x * x).mean(-1) - x.mean(-1) ** 2,
    "layer-norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
}


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (2, 0, 3)], ids=str)
@pytest.mark.parametrize("name", EMPTY_PROGRAMS)
def test_empty_tensors_give_the_originals_result(name, shape):
    """sampling drew points of a size-0 shape (reshape of 4 values into [0, 4]) and the rounding
    error divided by an empty Jacobian row (ZeroDivisionError)."""
    fn, x = EMPTY_PROGRAMS[name], torch.randn(shape)
    got, _ = optimized(fn, x)
    assert_same(got, fn(x))


@pytest.mark.parametrize("op, attrs", [("exp", ()), ("sum", (-2, False))], ids=["exp", "sum-of-none"])
def test_an_empty_input_is_sampled_empty_and_estimated_without_error(op, attrs):
    """Programs of Terms (the fuzzer's, ONNX models') reach sampling and the rounding error."""
    x = Term.input("x", (0, 4), "float32")
    point = sample_inputs({"x": ((0, 4), "float32")}, {}, torch.Generator().manual_seed(0))
    assert point["x"].shape == (0, 4)
    found = program_error(Program((x,), Term(op, (x,), attrs)))
    assert found is None or found.worst == 0.0


NAN_PROGRAMS = {
    "plus-nan": lambda x: x + math.nan,
    "nan-times-zero": lambda x: (x * math.nan) * 0,
    "exp-minus-one-of-nan": lambda x: torch.exp(x - math.nan) - 1,
    "max-with-nan": lambda x: torch.maximum(torch.exp(x), x / math.nan),
}


@pytest.mark.parametrize("name", NAN_PROGRAMS)
def test_a_nan_constant_gives_nan_as_the_original(name):
    """'NaN in range analysis' (ranges), then egglog's 'Unbound symbol nan'."""
    fn, x = NAN_PROGRAMS[name], torch.randn(3, 4)
    got, _ = optimized(fn, x)
    assert_same(got, fn(x))


def test_a_nan_constant_ranges_over_everything():
    x = Term.input("x", (3, 4), "float32")
    assert intervals([Term("add", (x, Term.const(math.nan)))]) == [TOP]


def _conv_bn(**bn):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, **bn), torch.nn.ReLU())


MODULES = {  # name: module, what the report's fallback names (None: optimized, no fallback)
    "train-batch-norm": (_conv_bn().train(), "batch norm"),
    "train-batch-norm-batch-statistics-only": (_conv_bn(track_running_stats=False).train(), None),
    "eval-batch-norm": (_conv_bn().eval(), None),
}


@pytest.mark.parametrize("name", MODULES)
def test_train_and_eval_modules_keep_outputs_and_state(name):
    """Train-mode batch norm stayed an opaque call_module and fx's dead-code elimination asked an
    unowned graph whether it was pure ('owning_module not set for purity check'). Train mode uses
    batch statistics and updates running ones: outputs and buffers must match the original's."""
    module, fallback = MODULES[name]
    reference, x = copy.deepcopy(module), torch.randn(2, 3, 8, 8)
    got, report = optimized(module, x, calls=2)
    for _ in range(2):
        want = reference(x)
    assert_same(got, want)
    for (key, mine), theirs in zip(module.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(mine, theirs), key
    assert (fallback in (report.fallback or "")) if fallback else not report.fallback


def test_meta_tensors_run_untouched_and_say_why():
    fn, x = (lambda x: torch.exp(x) + 1), torch.randn(3, 4, device="meta")
    got, report = optimized(fn, x)
    assert_same(got, fn(x))
    assert "meta" in report.fallback
