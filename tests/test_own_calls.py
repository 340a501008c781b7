"""A term the optimized program kept as the user wrote it (``Program.own``) runs torch's plain call, as eager does;
an op a rewrite made from other spellings keeps the kernel that holds to the op table's definition (its repairs and
guards: gelu's sign at -0 on AVX2, linear's sums past the dtype's max)."""
import functools
import math

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from egraph_opt import capture, saturate_and_extract
from egraph_opt.backends.torch_backend import build_module
from egraph_opt.kernels.torch_ops import PLAIN, TORCH
from egraph_opt.lang.term import Term
from egraph_opt.optimization.pipeline import optimize

W, B, G = (torch.randn(s, generator=torch.Generator().manual_seed(1)) for s in ((8, 8), (8,), (8,)))


def chain(x):
    """Each op the user's own call, then a spelled-out log-sum-exp that a rewrite fuses (so a plan is made)."""
    y = torch.log_softmax(F.gelu(F.layer_norm(F.linear(x, W, B), (8,), G, B, 1e-5)), -1)
    return y, torch.softmax(x, -1), torch.log(torch.exp(x).sum(-1))


def spelled(x):
    """gelu written out: the rewrite's gelu is no call of the user's."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def test_the_users_own_calls_bind_torchs_plain_kernel_and_a_rewrites_op_its_careful_one():
    x = torch.randn(4, 8)
    program, traced = capture(chain, (x,))
    targets = {n.target for n in build_module(program, traced).graph.nodes}
    assert {PLAIN[op] for op in ("linear", "gelu", "layer_norm", "softmax", "log_softmax")} <= targets
    assert not {TORCH[op] for op in ("linear", "gelu", "layer_norm", "softmax")} & targets
    program, traced = capture(spelled, (x,))  # the rewrite's form: gelu over the spelled-out one's operand
    made = program.with_roots({id(program.roots()[0]): Term("gelu", (program.inputs[0],), ("none",))})
    targets = {n.target for n in build_module(made, traced).graph.nodes}
    assert TORCH["gelu"] in targets and PLAIN["gelu"] not in targets


def upstream(x):
    """The user's calls over a value a rewrite made (log(1 + x) -> log1p): equal to the one they were called on."""
    return F.gelu(F.layer_norm(F.linear(torch.log(1 + x), W, B), (8,), G, B, 1e-5))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.act, self.down = torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), torch.nn.GELU(), \
            torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + self.down(self.act(self.norm(self.up(torch.log(1 + x.abs())))))


def test_the_users_calls_over_values_a_rewrite_made_bind_torchs_plain_kernel_in_templates_too():
    """Own-ness is per e-class: the call's op over operands equal to its own, wherever rewrites upstream made them;
    repeated blocks (one template, instantiated three times) carry it to every instance."""
    program, traced = capture(upstream, (torch.rand(4, 8),))
    result = optimize(program)
    targets = {n.target for n in build_module(result.program, traced).graph.nodes}
    assert result.ops_after.get("log1p") and {PLAIN[op] for op in ("linear", "gelu", "layer_norm")} <= targets
    assert not {TORCH[op] for op in ("linear", "gelu", "layer_norm")} & targets
    model = torch.nn.Sequential(Block(), Block(), Block())
    program, _ = capture(model, (torch.rand(4, 8),))
    result = optimize(program)
    assert any("template of" in s.phase for s in result.saturation) and result.ops_after.get("log1p") == 3
    targets = [n.target for n in build_module(result.program, model).graph.nodes]
    assert [targets.count(PLAIN[op]) for op in ("gelu", "layer_norm")] == [3, 3]
    assert TORCH["gelu"] not in targets and TORCH["layer_norm"] not in targets
    with torch.no_grad():
        x = torch.randn(4, 8)
        torch.testing.assert_close(saturate_and_extract(model, profile_db=False, profile_budget=0)(x), model(x))


@functools.cache
def _optimized():
    """``chain`` optimized on moderate values (validation draws from the first call's)."""
    g = saturate_and_extract(chain, profile_db=False, profile_budget=0)
    with torch.no_grad():
        g(torch.randn(4, 8))
    assert g.report.optimized and set(g.report.ops_after) >= {"logsumexp", "linear", "gelu"}, g.report
    return g


EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, 3.4e38, -3.4e38, 1e-45, -1e-45, 1e19, -1e19, 2.0, -30.0]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(EDGES) | st.floats(-4, 4), min_size=32, max_size=32))
def test_a_plan_gives_eagers_values_bit_for_bit_where_it_kept_the_users_calls(values):
    """Wherever the plan kept the user's calls, at +-0, +-inf, NaN, +-max, subnormals and sums past the max: eager's
    bits, NaN where NaN, each zero's sign (the careful kernels once gave float64's sum and gelu's -0 there)."""
    x = torch.tensor(values, dtype=torch.float32).reshape(4, 8)
    g = _optimized()
    with torch.no_grad():
        got, want = g(x), chain(x)
    for a, b in zip(got[:2], want[:2]):
        assert torch.equal(a.isnan(), b.isnan())
        assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)), (a, b)
        assert torch.equal(a.signbit()[a == 0], b.signbit()[b == 0])
    finite = want[2].isfinite()  # the rewrite's logsumexp: eager's value where eager's sum of exps did not overflow
    torch.testing.assert_close(got[2][finite], want[2][finite])
