"""A plan's run on CPU assumes its guards' fast cases (a linear's sum did not overflow, a layer norm's variance
neither, attention's scores cannot) and reads them all at once after it; where one fails it runs again, each guard
reading its own. The result is the careful run's, bit for bit, wherever a guard would have taken its careful path."""
import math
import os
import sys

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import egraph_opt.kernels.torch_ops as ops
from egraph_opt.kernels.torch_ops import TORCH, speculating

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from gpu import HostReads  # noqa: E402 - counts reads of tensor values into Python

B, T, H, D = 2, 5, 2, 4
C = H * D
#: a plan's mask is a constant whose facts (causal) are read once per version: here before any test counts reads
CAUSAL = torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
ops._mask_facts(CAUSAL, T, T)
EXTREMES = [math.inf, -math.inf, math.nan, 3e38, -3e38, 1e19, -1e19, 1e-45, -0.0, 0.0]


def block(x, w1, b1, w2, b2, g, beta):
    """A transformer block's guarded kernels: layer norm, the QKV linear, causal attention, a gelu'd linear and
    the residual add with a linear (linear_add), as a plan calls them."""
    h = TORCH["layer_norm"](x, g, beta, 1e-5)
    q, k, v = TORCH["linear"](h, w1, b1).reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
    o = TORCH["sdpa_masked"](q, k, v, CAUSAL, D ** -0.5).transpose(1, 2).reshape(B, T, C)
    return TORCH["linear_add"](TORCH["linear_act"](o, w2, b2, "gelu"), w2, b2, x)


def inputs(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(B, T, C), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,)]
    return [torch.randn(s, generator=gen) for s in shapes]


def counted(fn, runs: list):
    """``fn``, appending each run's count of host reads made while it runs (not after: the speculation's own)."""
    def run(*args):
        with HostReads() as reads:
            out = fn(*args)
        runs.append(len(reads.reads))
        return out
    return run


def test_moderate_inputs_run_once_and_read_nothing_while_running():
    args, runs = inputs(0), []
    with torch.no_grad():
        want = block(*args)  # a first call asks a few facts of the machine's kernels once
        got = speculating(counted(block, runs))(*args)
        assert runs == [0]
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 16), where=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 10 ** 6),
                                                               st.sampled_from(EXTREMES)), min_size=1, max_size=3))
def test_a_failed_assumption_runs_again_and_gives_the_careful_result(seed, where):
    """Extremes at random places of the input, the weights or the norms' parameters: the speculating run equals
    the guards' own (NaN where NaN), and where the fast run's values could differ it ran twice."""
    args = inputs(seed)
    for which, index, value in where:
        args[which].view(-1)[index % args[which].numel()] = value
    runs = []
    with torch.no_grad():
        got = speculating(counted(block, runs))(*args)
        want = block(*args)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert runs[0] == 0 and len(runs) in (1, 2) and (len(runs) == 1 or runs[1] > 0)
    if not all(a.isfinite().all() for a in args):  # a linear, norm or attention guard sees it
        assert len(runs) == 2


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.lists(st.sampled_from(EXTREMES + [1.0, -2.5, 7e3, 1e300, -1e300]), max_size=70), min_size=1,
                         max_size=5),
       dtypes=st.lists(st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]), min_size=5,
                       max_size=5), reciprocal=st.booleans(), large=st.booleans())
def test_assumptions_hold_only_where_every_guard_would_pass(values, dtypes, reciprocal, large):
    """The joint read accepts nothing that ``all_finite`` or a layer norm's 1/std check (with eps > 0: no 0, no
    NaN) would not, one by one, in any lane of a vectorized pass or its tail; and it accepts the rest, but for a
    1/std so small its reciprocal overflows (no variance of the dtype gives one: it reads as overflowed). Tensors of
    several dtypes, few elements (joined into one read) or many (each read where it lies)."""
    tensors = [torch.tensor(v, dtype=torch.float64).to(dtype) for v, dtype in zip(values, dtypes)]
    if large and tensors[0].numel():  # past the joined tensors' size: read where it lies
        tensors[0] = tensors[0].repeat(-(-(1 << 13) // tensors[0].numel()))
    assumed = ops._Assumed()
    token = ops._ASSUMED.set(assumed)
    try:
        for t in tensors:
            assert ops._assumes(t, reciprocal=reciprocal) is assumed
    finally:
        ops._ASSUMED.reset(token)
    one_by_one = all(not bool(t.isnan().any()) and bool((t != 0).all() if reciprocal else t.isfinite().all())
                     for t in tensors)
    tiny = reciprocal and any(bool(((t != 0) & (t.double().abs() < 1 / torch.finfo(t.dtype).max)).any()) for t in tensors)
    assert assumed.held() == (one_by_one and not tiny)


def test_the_scores_bound_is_assumed_and_read_after():
    """A q and k whose scores overflow float32 (|q| |k| D scale past its max) make the joint read fail, as the
    guard's own read does; below the bound they pass."""
    for big, over in ((1e18, False), (1e19, True)):
        q, k = torch.full((1, 2, 3, 4), big), torch.full((1, 2, 3, 4), big)
        assumed = ops._Assumed()
        token = ops._ASSUMED.set(assumed)
        try:
            assert ops._scores_overflow(q, k, 1.0) is False
        finally:
            ops._ASSUMED.reset(token)
        assert ops._scores_overflow(q, k, 1.0) is over and assumed.held() is not over


def test_a_plan_meeting_few_guards_reads_each_after_its_first_run():
    """A joint read costs a few ops whatever it reads: a run that met fewer than SPECULATE_FROM guards tells its plan
    to read each guard's own from then on (no read while the first run runs; the linear's own read after)."""
    x, w, b = inputs(1)[:3]
    runs = []
    plan = speculating(counted(lambda x: TORCH["linear"](x, w, b), runs))
    with torch.no_grad():
        first, second = plan(x), plan(x)
    assert ops.SPECULATE_FROM > 1 and runs == [0, 1]
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_a_guard_on_a_large_tensor_reads_at_once():
    """A run holds what it assumed to its end: a tensor over SPECULATE_UP_TO elements (a prefill's activations) is
    read by its guard at once, not held."""
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(ops.SPECULATE_UP_TO // 8 + 1, 16, generator=gen), torch.randn(8, 16, generator=gen)
    runs = []
    with torch.no_grad():
        speculating(counted(lambda x: TORCH["linear"](x, w, None), runs))(x)
    assert runs == [1]


def test_a_view_stands_for_its_base_only_where_it_holds_every_element():
    """A view recorded whole (F.linear's 3-D output of its 2-D product) stands for its base: a later view of the base
    (attention's q, k) is not read again. A view of part of it (a slice) or of its elements out of order stands for
    nothing more: a NaN in the rest of the base is read by the later view's record."""
    base = torch.zeros(4, 6)
    base[3, 5] = math.nan
    for first, whole in ((base.view(2, 12), True), (base[:2], False), (base.t(), False)):
        assumed = ops._Assumed()
        token = ops._ASSUMED.set(assumed)
        try:
            ops._assumes(first)
            ops._assumes(base[3:])
        finally:
            ops._ASSUMED.reset(token)
        assert len(assumed.tensors) == (1 if whole else 2) and not assumed.held()
