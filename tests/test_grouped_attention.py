"""Grouped-query attention (Llama, Mistral, Qwen2, Gemma: fewer key/value heads than query heads):
the attention ops take k and v of fewer heads as their own (``ops.groups``), each head repeated in
a row as transformers' repeat_kv, repeat_interleave and torch's enable_gqa repeat them; the
repeat_kv chain before an attention is rewritten away (``repeat-kv-into-*``), and the kernels read
the unrepeated heads, at the extremes as the definition does."""
import contextlib
import itertools
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from egraph_opt import saturate_and_extract
from egraph_opt.egraph.engine import EGraph
from egraph_opt.kernels.torch_ops import TORCH, forcing_device_path
from egraph_opt.lang import ops
from egraph_opt.lang.ops import OPS
from egraph_opt.lang.term import Term, shapes
from egraph_opt.rulesets import catalogue

ATTENTION = ["sdpa", "sdpa_masked", "sdpa_filled", "sdpa_guarded", "sdpa_floored", "sdpa_filled_biased",
             "sdpa_filled_then_biased"]


def repeat_kv(x, groups: int):
    """transformers' repeat_kv, as its models write it."""
    b, h, t, d = x.shape
    return x[:, :, None, :, :].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def test_a_head_of_q_reads_the_kv_head_repeat_kv_and_repeat_interleave_and_enable_gqa_give_it():
    q, k, v = torch.randn(2, 6, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    assert ops.groups(q, k) == 3
    for repeated in (repeat_kv(k, 3), k.repeat_interleave(3, 1), ops.grouped(q, k)):
        assert torch.equal(repeated, k[:, [h // 3 for h in range(6)]])
    torch.testing.assert_close(ops.sdpa(q, k, v, 0.3, False), ops.sdpa(q, repeat_kv(k, 3), repeat_kv(v, 3), 0.3, False))
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True),
                               ops.sdpa(q, k, v, 0.3, False))
    # as many heads, one head (a broadcast), heads that do not divide q's, no head axis: no group
    assert [ops.groups(q, x) for x in (q, k[:, :1], torch.randn(2, 4, 5, 8), torch.randn(5, 8))] == [1] * 4
    assert ops.groups(torch.randn(6, 1, 8), torch.randn(3, 5, 8)) == 2  # heads folded into a batch


def _points():
    """q (1, 4, 3, 8) and k, v of 2 heads; then one element of kv head 1 (which q heads 2 and 3
    read) at +-inf or NaN in k, +inf or NaN in v, or so large that the scores overflow."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen) for shape in ((1, 4, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8)))
    yield q, k, v
    for name, value in (("k", math.inf), ("k", -math.inf), ("k", math.nan), ("v", math.inf), ("v", math.nan),
                        ("k", 1e37)):
        kv = {"k": k.clone(), "v": v.clone()}
        kv[name][0, 1, 2, 3] = value
        yield q, kv["k"], kv["v"]


def _masks(op: str) -> list[tuple]:
    """The attributes and mask operand of ``op``: each with a row of queries that keeps no key."""
    keep = torch.rand(1, 1, 3, 5, generator=torch.Generator().manual_seed(1)) < 0.7
    keep[..., 0], keep[..., 1, :] = True, False
    bias = torch.zeros(keep.shape).masked_fill(~keep, -math.inf)
    padding = torch.tensor([-3.4028234663852886e38, 0.0, 0.0, -3.4028234663852886e38, 0.0])  # GPT-NeoX's mask
    return {"sdpa": [(0.25, False), (0.25, True)], "sdpa_masked": [(bias, 0.25)],
            "sdpa_filled": [(keep, 0.25, -1e9)], "sdpa_guarded": [(bias, 0.25)],
            "sdpa_floored": [(bias, 0.25, -3.4028234663852886e38), (bias, 0.25, -1.0)],
            "sdpa_filled_biased": [(keep, torch.arange(5.0) * -0.5, 0.25, -3.4028234663852886e38)],
            "sdpa_filled_then_biased": [(keep, padding, 0.25, -3.4028234663852886e38), (keep, padding, 0.25, -1e4)]}[op]


@pytest.mark.parametrize("op", ATTENTION)
def test_the_kernels_read_fewer_kv_heads_as_the_repeated_ones_at_the_extremes(op):
    """Each CPU kernel on k and v of 2 heads gives what it gives on them repeated to q's 4 (the
    rule's two sides), and that is the float64 definition, NaN where it is NaN: the kernels' guard
    paths (overflowing scores per attention, rows every key masks, the mean of v of a row that
    keeps none) read each q head's own kv head."""
    for (q, k, v), rest, device in itertools.product(_points(), _masks(op), (False, True)):
        with forcing_device_path() if device else contextlib.nullcontext():  # guards selected as on a GPU
            got = TORCH[op](q, k, v, *rest)
            left = TORCH[op](q, repeat_kv(k, 2), repeat_kv(v, 2), *rest)
        wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in rest]
        truth = OPS[op].impl(q.double(), repeat_kv(k, 2).double(), repeat_kv(v, 2).double(), *wide)
        torch.testing.assert_close(OPS[op].impl(q.double(), k.double(), v.double(), *wide), truth, equal_nan=True)
        assert got.shape == (1, 4, 3, 8) and (got.isnan() == left.isnan()).all()
        torch.testing.assert_close(got, left, rtol=1e-6, atol=1e-6, equal_nan=True)
        torch.testing.assert_close(got.double(), truth, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("op", ATTENTION)
def test_one_kv_head_runs_torchs_fused_kernel_and_gives_the_broadcast_definition(op):
    """Multi-query attention (GPTBigCode, Falcon, Gemma 2B: one k and v head) broadcasts that head; torch's kernel
    takes it as grouped (enable_gqa), where a broadcast head runs its math path (GPTBigCode's plan measured slower
    than eager for it), at the extremes as the definition."""
    for (i, (q, k, v)), rest in itertools.product(enumerate(_points()), _masks(op)):
        k, v = k[:, 1:], v[:, 1:]  # the head holding the extremes
        with torch.profiler.profile() as profile:
            got = TORCH[op](q, k, v, *rest)
        wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in rest]
        truth = OPS[op].impl(q.double(), k.expand(1, 4, 5, 8).double(), v.expand(1, 4, 5, 8).double(), *wide)
        torch.testing.assert_close(got.double(), truth, rtol=1e-4, atol=1e-5, equal_nan=True)
        if i == 0:  # finite: no guard takes the definition
            assert "aten::_scaled_dot_product_attention_math" not in {e.key for e in profile.key_averages()}


def _run(fn, *args):
    f = saturate_and_extract(fn, profile_db=False, profile_budget=0)
    torch.testing.assert_close(f(*args), fn(*args))
    (plan,) = f.plans.values()
    assert plan.report.optimized, plan.report.fallback
    return plan.report


MASK = torch.zeros(1, 1, 1, 9).masked_fill(torch.arange(9) > 6, -math.inf)
Q, K, V = torch.randn(1, 4, 1, 32), torch.randn(1, 2, 9, 32), torch.randn(1, 2, 9, 32)


@pytest.mark.parametrize("spelling", ["repeat_kv", "repeat_interleave"])
def test_repeat_kv_before_an_attention_is_rewritten_away(spelling):
    """A decode step's attention over its whole cache: the plan copies no head of k or v."""
    def attention(q, k, v, mask):
        k, v = (repeat_kv(x, 2) if spelling == "repeat_kv" else x.repeat_interleave(2, dim=1) for x in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    report = _run(attention, Q, K, V, MASK)
    assert "repeat-kv-into-sdpa-masked" in {name for name, *_ in report.rewrites}
    assert "expand" not in report.ops_after and "torch.expand" not in report.kernels


def test_torchs_own_grouped_attention_is_lowered_to_the_op():
    report = _run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), Q, K, V)
    assert report.ops_before == {"sdpa": 1} and not report.opaque


@pytest.mark.parametrize("spelling", ["tiled", "extra-axis"])
def test_a_repeat_other_than_repeat_kvs_stays(spelling):
    """k.repeat(1, 2, 1, 1) tiles the heads (q's head h reads h % Hkv, not h // G); a k of rank 5
    viewed as repeat_kv's (B, Hkv, 1, T, D) would make the attention's output rank 5: neither is
    rewritten, both stay exact."""
    def tiled(q, k, v):
        return F.scaled_dot_product_attention(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1))

    def extra_axis(q, k, v):
        k, v = (x.reshape(1, 2, 1, 9, 32).expand(1, 2, 2, 9, 32).reshape(1, 4, 9, 32) for x in (k, v))
        return F.scaled_dot_product_attention(q, k, v)
    fn, args = (tiled, (Q, K, V)) if spelling == "tiled" else (extra_axis, (Q, K[None], V[None]))
    report = _run(fn, *args)
    assert not any(name.startswith("repeat-kv-into") for name, *_ in report.rewrites)
    assert report.ops_after == report.ops_before


def test_a_llama_with_fewer_kv_heads_generates_eagers_tokens_copying_no_cache():
    """A tiny Llama (4 query heads, 2 key/value heads, random weights) generating through a
    decorated forward: eager's tokens, and no plan (prefill, decode steps traced, decode steps made
    from their size family) expands a cache's heads."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, vocab_size=100)
    m = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 100, (1, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = m.generate(ids, max_new_tokens=4, do_sample=False)
        m.forward = saturate_and_extract(m.forward, profile_db=False, profile_budget=0)
        torch.testing.assert_close(m.generate(ids, max_new_tokens=4, do_sample=False), ref)
    reports = [p.report for p in m.forward.plans.values()]
    assert len(reports) == 4 and all(r.optimized for r in reports)
    assert all("torch.expand" not in r.kernels and r.kernels["torch.sdpa_masked"] == 2 for r in reports)


def test_the_triton_path_reads_the_unrepeated_heads_in_a_plan(monkeypatch):
    """Under the test switch (Triton kernels on CPU tensors, in the interpreter) the attention over
    a whole cache binds Triton's kernel, which reads q's head h from k's and v's head h // G; with
    the device path forced, as on a GPU."""
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")

    def attention(q, k, v, mask):
        return F.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=mask)
    f = saturate_and_extract(attention, profile_db=False, profile_budget=0)
    f(Q, K, V, MASK)
    with forcing_device_path():
        torch.testing.assert_close(f(Q, K, V, MASK), attention(Q, K, V, MASK), rtol=1e-5, atol=1e-5)
    assert "triton.sdpa_masked" in f.report.kernels and "expand" not in f.report.ops_after, f.report


def test_an_attention_over_grouped_heads_is_not_decomposed_into_matmuls():
    """attention-fuse-rev writes softmax(q k^T * c) v, whose matmuls broadcast no grouped heads:
    only where k and v have q's heads."""
    def after(kv_heads: int) -> set:
        q, k, v = (Term.input(n, (1, h, 3, 8)) for n, h in (("q", 4), ("k", kv_heads), ("v", kv_heads)))
        term = Term("sdpa", (q, k, v), (0.5, False))
        eg = EGraph()
        (ref,) = eg.add([term], None, shapes([term]))
        eg.add_rules("r", [catalogue()["attention-fuse-rev"]])
        eg.saturate("r", max_iterations=10, max_enodes=1000, max_seconds=5)
        snap = eg.snapshot()
        return {n.op for n in snap.classes[snap.class_of_ref[ref]]}
    assert after(4) == {"sdpa", "matmul"} and after(2) == {"sdpa"}
