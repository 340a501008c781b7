"""Fusions found by saturation across spellings, and not taken where they would not pay."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from egraph_opt import capture, optimize, saturate_and_extract
from egraph_opt.rulesets import Family, catalogue
from egraph_opt.kernels.torch_ops import TORCH


def optimized_report(fn, *args, tol=1e-5, **options):
    """Optimize ``fn``, check it still computes what ``fn`` does on ``args``, return the report."""
    f = saturate_and_extract(fn, **options)
    with torch.no_grad():
        torch.testing.assert_close(f(*args), fn(*args), rtol=tol, atol=tol)
    return f.report


def ops_after(fn, *args, **options):
    program, _ = capture(fn, args)
    return optimize(program, **options).ops_after


Q, K, V = (torch.randn(2, 4, 8, 16) for _ in range(3))
SPELLINGS = {  # naive attention as people write it
    "divide": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(16), -1) @ v,
    "multiply-left": lambda q, k, v: torch.softmax(0.25 * (q @ k.transpose(-1, -2)), -1) @ v,
    "scale-q-first": lambda q, k, v: torch.softmax((q * 0.25) @ k.permute(0, 1, 3, 2), -1) @ v,
    "explicit-shift": lambda q, k, v: _shifted(q @ k.mT * 0.25) @ v,
    "naive-exp": lambda q, k, v: _naive(q @ k.transpose(-2, -1) / 4.0) @ v,
}


def _shifted(s):
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _naive(s):
    return torch.exp(s) / torch.exp(s).sum(-1, keepdim=True)


@pytest.mark.parametrize("spelling", SPELLINGS, ids=str)
def test_every_attention_spelling_becomes_one_fused_op(spelling):
    fn = SPELLINGS[spelling]
    f = saturate_and_extract(fn)
    torch.testing.assert_close(f(Q, K, V), fn(Q, K, V), rtol=1e-5, atol=1e-5)
    assert f.report.ops_after == {"sdpa": 1}


def test_masked_attention_becomes_masked_sdpa():
    mask = torch.ones(8, 8, dtype=torch.bool).triu(1)

    def causal(q, k, v, m):
        s = (q @ k.transpose(-2, -1) / 4.0).masked_fill(m, float("-inf"))
        return torch.softmax(s, -1) @ v

    f = saturate_and_extract(causal)
    torch.testing.assert_close(f(Q, K, V, mask), causal(Q, K, V, mask), rtol=1e-5, atol=1e-5)
    assert "sdpa_masked" in f.report.ops_after and "softmax" not in f.report.ops_after


class _CachedBias(nn.Module):
    """LeViT's attention: a bias gathered from a table (zeros as initialized) once, then a constant of the trace."""

    def __init__(self):
        super().__init__()
        self.table, self.cache = nn.Parameter(torch.zeros(4, 9)), {}
        self.register_buffer("index", torch.randint(0, 9, (6, 6)), persistent=False)

    def forward(self, q, k, v):
        if "bias" not in self.cache:
            self.cache["bias"] = self.table[:, self.index]
        return torch.softmax(q @ k.transpose(-1, -2) * 0.125 + self.cache["bias"], -1) @ v


def test_an_attention_bias_folded_to_a_number_binds_and_runs():
    """A constant bias of one value is a number in the program: the masked kernels took only tensors (AttributeError:
    'float' object has no attribute 'to', so the program fell back)."""
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    m = _CachedBias().eval()
    f = saturate_and_extract(m, profile_budget=0)
    with torch.no_grad():
        for _ in range(2):  # the first call fills the cache, so it runs the original
            torch.testing.assert_close(f(q, k, v), m(q, k, v), rtol=1e-5, atol=1e-5)
    assert f.report.optimized and "sdpa_masked" in f.report.ops_after, f.report.fallback


def test_gpt2_where_mask_fuses_and_keeps_its_fully_masked_rows():
    """GPT-2's where(causal, w, finfo.min): a row that keeps no key averages v (not NaN)."""
    keep = torch.ones(8, 8, dtype=torch.bool).tril()
    keep[3] = False

    def gpt2(q, k, v, keep):
        w = torch.where(keep, q @ k.transpose(-1, -2) / 4.0, torch.finfo(torch.float32).min)
        return torch.softmax(w, -1) @ v

    f = saturate_and_extract(gpt2)
    torch.testing.assert_close(f(Q, K, V, keep), gpt2(Q, K, V, keep), rtol=1e-5, atol=1e-5)
    assert f.report.ops_after == {"sdpa_filled": 1}


@pytest.mark.parametrize("heads", [(2, 4), (4, 2)])
def test_baddbmm_over_flattened_heads_viewed_back_fuses_only_where_the_view_restores_them(heads):
    """baddbmm(alibi, q, k^T) over (B * H, T, D) merges, viewed to ``heads``: where that is (B, H), the
    view passes the scale and the (B * H, 1, T) bias (viewed alike) to the product over heads, which fuses;
    viewed otherwise, the rows are other heads' and the program stays as written."""
    alibi = torch.randn(8, 1, 8)

    def bloom_like(q, k, v, alibi):
        s = torch.baddbmm(alibi, q.reshape(8, 8, 16), k.reshape(8, 8, 16).transpose(1, 2), beta=0.5, alpha=0.25)
        return torch.softmax(s.view(*heads, 8, 8), -1) @ v.reshape(*heads, 8, 16)

    report = optimized_report(bloom_like, Q, K, V, alibi)
    assert ("softmax" not in report.ops_after) == (heads == (2, 4)), report.ops_after


def test_gpt_neox_mask_added_after_the_fill_fuses_and_keeps_left_padded_rows():
    """GPT-NeoX: where(causal, s, finfo.min) + mask; a left-padded query whose only causal key is
    padding scores finfo.min + s there and finfo.min on the later keys: each weighs alike, as written."""
    keep = torch.ones(8, 8, dtype=torch.bool).tril()
    mask = torch.zeros(2, 1, 1, 8)
    mask[1, ..., :2] = torch.finfo(torch.float32).min

    def neox(q, k, v, keep, mask):
        w = torch.where(keep, q @ k.transpose(-1, -2) * 0.25, torch.finfo(torch.float32).min)
        return torch.softmax(w + mask, -1) @ v

    report = optimized_report(neox, Q, K, V, keep, mask)
    assert report.ops_after == {"sdpa_filled_then_biased": 1}, report.ops_after


def test_attention_is_not_fused_when_its_weights_are_also_used():
    def weights_too(q, k, v):
        w = torch.softmax(q @ k.transpose(-2, -1) / 4.0, -1)
        return w @ v, w

    assert "sdpa" not in ops_after(weights_too, Q, K, V)


class NaiveBlock(nn.Module):
    """GPT-2 style: layer norm from mean/var, causal naive attention, tanh-gelu MLP."""

    def __init__(self, c=32):
        super().__init__()
        self.ln_w, self.ln_b = nn.Parameter(torch.randn(c)), nn.Parameter(torch.randn(c))
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.register_buffer("mask", torch.ones(16, 16, dtype=torch.bool).triu(1))

    def norm(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.ln_w + self.ln_b

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).split(32, -1)
        s = (q @ k.transpose(-2, -1) / math.sqrt(32)).masked_fill(self.mask, float("-inf"))
        x = x + self.proj(torch.softmax(s, -1) @ v)
        h = self.fc(self.norm(x))
        g = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + self.out(g)


def test_naive_block_fuses_layer_norm_attention_gelu_and_residuals():
    # static estimates: the kernel a residual binds must not read the rows other tests leave in the session's database
    report = optimized_report(NaiveBlock().eval(), torch.randn(2, 16, 32), tol=1e-4, profile_db=False)
    after = report.ops_after
    assert after.get("layer_norm") == 2 and after.get("sdpa_masked") == 1
    assert after.get("linear_act") == 1 and "tanh" not in after and "var" not in after
    assert report.kernels.get("torch.linear_add") == 2 and "add" not in after  # each residual in a GEMM's epilogue


def test_a_residual_stays_an_add_where_the_linear_is_used_elsewhere():
    """Fused, the GEMM would run twice (once more for its other use): extraction keeps one."""
    w, b = torch.randn(32, 32), torch.randn(32)

    def fn(x, r):
        y = F.linear(x, w, b)
        return r + y, torch.relu(y)

    after = ops_after(fn, torch.randn(2, 16, 32), torch.randn(2, 16, 32))
    assert after.get("linear") == 1 and after.get("add") == 1 and "linear_add" not in after, after


def test_a_linear_scaled_by_a_power_of_two_is_one_gemm_equal_at_the_extremes():
    """(x @ W + b) * 0.5, / 4, * 2^100 and F.linear(...) * -2: one call (a GEMM with alpha = beta = the scale
    from 1 up; below, its output scaled in place) that equals the original with rows of x at +-inf, NaN, +-0, +-max, subnormals and results past the max;
    a scale of 0.3 rounds otherwise than the program: it stays a product."""
    w, b = torch.randn(32, 16), torch.randn(16)
    top, tiny = torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny
    x = torch.randn(12, 32)
    for i, v in enumerate([math.inf, -math.inf, math.nan, 0.0, -0.0, top, -top, tiny * 1e-3, tiny, 1e36, 1e-37]):
        x[i] = v
    x[-1, ::2] = top
    kept = torch.tensor([i not in (5, 6, 11) for i in range(12)])
    for scale, fn in ((0.5, lambda x: (x @ w + b) * 0.5), (0.25, lambda x: (x @ w + b) / 4),
                      (2.0 ** 100, lambda x: (x @ w + b) * 2.0 ** 100), (-2.0, lambda x: F.linear(x, w.T, b) * -2.0)):
        f = saturate_and_extract(fn)
        with torch.no_grad():
            r = torch.randn(12, 32)
            torch.testing.assert_close(f(r), fn(r))  # the first call: traced and validated
            for v in (x, x * 1e-30):  # and subnormal results
                careful = (v.double() @ w.double() + b.double()).float() * scale  # x W + b rounded once, scaled
                torch.testing.assert_close(f(v), careful, rtol=1e-4, atol=1e-5, equal_nan=True)
                torch.testing.assert_close(f(v)[kept], fn(v)[kept], equal_nan=True)  # the original but
                # where its terms add up past the max (there float32's sum is an order's accident)
        assert f.report.kernels.get("torch.linear_scaled") == 1 and "mul" not in f.report.ops_after, f.report.kernels
    assert ops_after(lambda x: (x @ w + b) * 0.3, x).get("mul") == 1


class Dense(nn.Module):
    """A linear layer as minGPT-style code and JAX ports write it: W stored (in, out), x @ W + b."""

    def __init__(self, i: int, o: int):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(i, o) / i ** 0.5), nn.Parameter(0.1 * torch.randn(o))

    def forward(self, x):
        return x @ self.w + self.b


def test_linear_layers_written_x_matmul_w_plus_b_become_linear_ops():
    mlp = nn.Sequential(Dense(32, 128), nn.ReLU(), Dense(128, 32)).eval()
    after = optimized_report(mlp, torch.randn(2, 16, 32), tol=1e-4).ops_after
    assert after.get("linear", 0) + after.get("linear_act", 0) == 2 and "matmul" not in after, after


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_conv_batch_norm_folds_in_eval_mode():
    model = ConvBN()
    model.bn.running_mean.normal_()
    model.bn.running_var.uniform_(0.5, 2.0)
    after = optimized_report(model.eval(), torch.randn(2, 3, 10, 10), tol=1e-4).ops_after
    assert "batch_norm" not in after and after.get("conv2d") == 1


def test_batch_norm_with_statistics_from_inputs_is_not_folded():
    def bn_of_inputs(x, w, mean, var):
        return F.batch_norm(F.conv2d(x, w), mean, var, torch.ones(8), torch.zeros(8), False)

    args = (torch.randn(2, 3, 6, 6), torch.randn(8, 3, 3, 3), torch.randn(8), torch.rand(8) + 0.5)
    assert "batch_norm" in ops_after(bn_of_inputs, *args)


def test_unbiased_variance_is_not_a_layer_norm():
    def almost(x):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5)  # var is unbiased here

    assert "layer_norm" not in ops_after(almost, torch.randn(4, 8))


def test_no_decomposition_contains_the_op_it_defines():
    from egraph_opt.lang.pattern import find, skeleton

    for rule in catalogue().values():
        if rule.family is Family.DECOMPOSITION:
            lhs_op = rule.lhs_pattern.op
            rhs, _ = skeleton(rule.rhs_pattern)
            from egraph_opt.lang.term import postorder
            assert lhs_op not in {t.op for t in postorder([rhs])}, rule.name


class Projections(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 16)

    def forward(self, x, y):
        q, k, v = self.q(x), self.k(x), self.v(y)
        return torch.softmax(q @ k.transpose(-2, -1) / 32 ** 0.5, -1) @ v


class SelfAttentionProjections(Projections):
    def forward(self, x):
        return super().forward(x, x)


def test_projections_of_one_input_become_one_matmul_sliced():
    report = optimized_report(SelfAttentionProjections().eval(), torch.randn(2, 8, 32))
    assert report.ops_after.get("linear") == 1 and report.ops_after.get("slice") == 3
    assert any(name.startswith("linear-horizontal-fuse") for name, _, _ in report.rewrites)


class BiasFreeProjections(nn.Module):  # LLaMA's: q, k, v and the MLP's gate and up without biases
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(32, n, bias=False) for n in (32, 32, 16))

    def forward(self, x):
        return torch.softmax(self.q(x) @ self.k(x).transpose(-2, -1) / 32 ** 0.5, -1) @ self.v(x)


def test_bias_free_projections_of_one_input_become_one_matmul_sliced():
    report = optimized_report(BiasFreeProjections().eval(), torch.randn(2, 8, 32))
    assert report.ops_after.get("slice") == 3, report.ops_after
    assert any(name.startswith("matmul-horizontal-fuse") for name, _, _ in report.rewrites)


def test_projections_of_different_inputs_stay_apart():
    report = optimized_report(Projections().eval(), torch.randn(2, 8, 32), torch.randn(2, 8, 32))
    assert report.ops_after.get("linear") == 2  # q and k fused; v reads another input


def test_folded_weights_follow_parameter_updates_and_carry_gradients():
    model = SelfAttentionProjections().eval()
    f = saturate_and_extract(model)
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        f(x)
        model.q.weight.add_(0.5)  # an optimizer step: the concatenated weights must be redone
        torch.testing.assert_close(f(x), model(x), rtol=1e-5, atol=1e-5)
    assert f.report.kernels.get("folded") == 2  # weights and biases, concatenated once
    f(x).sum().backward()
    assert model.q.weight.grad is not None and model.v.bias.grad is not None


class _NormedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(32, 48, bias=False), nn.Linear(48, 16, bias=False)

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # a fused norm: a plan of its own
        return self.down(torch.relu(self.up(x)))


def test_a_bias_free_projection_runs_as_atens_linear_on_the_parameter_itself():
    """x @ W.T of a bias-free nn.Linear (LLaMA's projections): F.linear on the parameter, aten's linear
    being that very matmul, with no transpose folded or run per call; eager's outputs and gradients."""
    model, x = _NormedMLP(), torch.randn(2, 8, 32)
    f = saturate_and_extract(model, profile_db=False, profile_budget=0)
    with torch.no_grad():
        torch.testing.assert_close(f(x), model(x), rtol=1e-6, atol=1e-6)
    assert f.report.optimized and "folded" not in f.report.kernels, f.report.kernels
    f(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for got, p in zip(grads, model.parameters()):
        torch.testing.assert_close(got, p.grad)


def test_folded_weights_work_under_inference_mode():
    with torch.inference_mode():
        model = SelfAttentionProjections().eval()  # parameters are inference tensors here
        f = saturate_and_extract(model)
        x = torch.randn(2, 8, 32)
        torch.testing.assert_close(f(x), model(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(f(x), model(x), rtol=1e-5, atol=1e-5)
        assert f.report.optimized, f.report.fallback  # not the original run untouched


def _built_mask_attention(q, k, v):
    t = q.shape[-2]
    keep = torch.arange(t)[:, None] >= torch.arange(t)[None, :]
    return torch.softmax((q @ k.transpose(-2, -1) / 4.0).masked_fill(~keep, float("-inf")), -1) @ v, keep


class _Dispatched(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.name())
        return func(*args, **(kwargs or {}))


def test_a_mask_built_in_the_program_is_computed_once_and_rebuilt_when_written():
    """The mask depends on no input: built when the plan is, not per call (the kernel then
    knows it causal without reading it again); the caller writing the returned mask does not
    change the next call's."""
    f = saturate_and_extract(_built_mask_attention, profile_budget=0)  # kept whatever its speed
    q, k, v = (torch.randn(2, 3, 6, 4) for _ in range(3))
    out, keep = f(q, k, v)
    torch.testing.assert_close(out, _built_mask_attention(q, k, v)[0], rtol=1e-5, atol=1e-5)
    assert f.report.kernels.get("folded") == 2 and f.report.optimized, f.report  # the bias, the mask
    with _Dispatched() as seen:
        f(q, k, v)
    assert not [op for op in seen.ops if "arange" in op or "ge" in op.split("::")[-1]], seen.ops
    keep.fill_(False)
    torch.testing.assert_close(f(q, k, v)[1], torch.ones(6, 6, dtype=torch.bool).tril())


class BufferMaskedAttention(nn.Module):
    def __init__(self, t: int):
        super().__init__()
        self.register_buffer("mask", torch.ones(t, t, dtype=torch.bool).triu(1))

    def forward(self, q, k, v):
        s = (q @ k.transpose(-2, -1) / 4.0).masked_fill(self.mask, float("-inf"))
        return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_a_mask_buffer_written_in_place_is_seen(mode):
    """The bias folded from a mask buffer, and what the kernel reads from it (causal, dead rows),
    are redone when the buffer is written: a reloaded state dict, a fill_."""
    model = BufferMaskedAttention(6).eval()
    f = saturate_and_extract(model)
    q, k, v = (torch.randn(2, 3, 6, 4) for _ in range(3))
    with mode():
        for write in (None, lambda m: m.load_state_dict({"mask": torch.zeros(6, 6, dtype=torch.bool)}),
                      lambda m: m.mask[2].fill_(True)):  # the last leaves row 2 fully masked: NaN
            if write:
                write(model)
            torch.testing.assert_close(f(q, k, v), model(q, k, v), rtol=1e-5, atol=1e-5, equal_nan=True)
            assert f.report.ops_after.get("sdpa_masked") == 1 and f.report.kernels.get("folded") == 1


def test_half_precision_attention_is_optimized_under_inference_mode():
    """Its report's error estimate takes derivatives, which inference mode would not record."""
    f = saturate_and_extract(lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / 8.0, -1) @ v)
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.float16) for _ in range(3))
    with torch.inference_mode():
        out = f(q, k, v)
    assert f.report.optimized, f.report.fallback
    assert f.report.ops_after.get("sdpa") == 1 and f.report.error is not None
    torch.testing.assert_close(out, torch.softmax(q @ k.transpose(-2, -1) / 8.0, -1) @ v,
                               rtol=1e-2, atol=1e-2)


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("spelling", [
    lambda x, w: _rms(x) * w,                                     # Llama4RMSNorm
    lambda x, w: w * _rms(x),                                     # LlamaRMSNorm (float32)
    lambda x, w: x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w,
    lambda x, w: _rms(x) * (1.0 + w),                             # GemmaRMSNorm
    lambda x, w: F.rms_norm(x, (8,), w, 1e-6),
], ids=["times-weight", "weight-first", "divide-sqrt", "one-plus-weight", "functional"])
def test_rms_norm_spellings_become_one_op(spelling):
    x, w = torch.randn(4, 8), torch.randn(8)
    after = optimized_report(spelling, x, w).ops_after
    assert after.get("rms_norm") == 1 and "rsqrt" not in after and after.get("mul", 0) == 0, after


def test_rms_norm_takes_in_no_weight_of_rank_two():
    """rms-norm-weight's guard: a (T, C) weight is no per-channel scale; the product stays."""
    after = optimized_report(lambda x, w: _rms(x) * w, torch.randn(4, 8), torch.randn(4, 8)).ops_after
    assert after.get("rms_norm") == 1 and after.get("mul") == 1, after


def test_widened_rms_norm_fires_only_for_half_precision():
    """rms-norm-fuse-widened-*: x * rsqrt(mean(x.float()^2)) is rms_norm(x.float()) for a half x
    only; for a float64 x the product is float64 and the rule must not fire."""
    def widened(x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)

    assert "rms_norm" not in ops_after(widened, torch.randn(4, 8, dtype=torch.float64))
    half = optimized_report(widened, torch.randn(4, 8).half(), tol=1e-3).ops_after
    assert half.get("rms_norm") == 1, half


def test_a_filled_masks_guards_read_one_bound_of_the_scores():
    """sdpa_filled's overflow guard and its fill guard share one bound of q k^T: a min-max pass over q and one over k,
    not two of each (at T=16 the second pair cost 10 us of its 62)."""
    q, k, v = (torch.randn(2, 4, 16, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    keep = torch.ones(2, 1, 16, 16, dtype=torch.bool).tril()
    fill = torch.finfo(torch.float32).min
    with torch.no_grad(), _Dispatched() as seen:
        out = TORCH["sdpa_filled"](q, k, v, keep, 0.25, fill)
    assert seen.ops.count("aten::aminmax") == 2, seen.ops
    want = torch.softmax(torch.where(keep, q @ k.transpose(-2, -1) * 0.25, fill), -1) @ v
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
