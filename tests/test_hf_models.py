"""Hugging Face models with random weights (bench/hf_models.py), decorated as a user would: the
optimized forward equals eager and holds the fused ops the model spells out (attention as sdpa,
its norms, gelu / SwiGLU / GeGLU / quick gelu, rotary embedding). Tiny configs (width 32, one
layer, T=16), priced by static estimates and never timed: whether a fusion pays is
bench/hf_models.py's question."""
import sys
import warnings
from pathlib import Path

import pytest
import torch

from egraph_opt import saturate_and_extract

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from hf_models import build  # noqa: E402

_LLAMA = {"rms_norm", "rotary", "sdpa_masked", "silu"}
_ENCODER = {"layer_norm", "linear_act", "sdpa_masked"}
#: architecture -> the fused ops its optimized program must hold
FUSES = {
    "llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA, "phi3": _LLAMA,
    "gemma": {"geglu", "rms_norm", "rotary", "sdpa_masked"},
    "gemma2": {"geglu", "rms_norm", "rotary"},  # tanh soft-capped scores: softmax, no sdpa
    "phi": {"layer_norm", "linear_act", "rotary", "sdpa_masked"},
    "gpt2": {"gelu", "layer_norm", "sdpa_masked"},
    "gpt_neox": {"layer_norm", "linear_act", "rotary", "sdpa_masked"},
    "opt": _ENCODER, "bert": _ENCODER, "roberta": _ENCODER, "distilbert": _ENCODER, "vit": _ENCODER,
    "bloom": {"layer_norm", "linear_act"},  # ALiBi and the mask added one after the other
    "falcon": {"gelu", "layer_norm", "rotary", "sdpa_masked"},
    "t5_encoder": {"rms_norm", "sdpa_masked"},
    "clip_text": {"layer_norm", "sdpa_masked", "swish"},
    "whisper_encoder": {"layer_norm", "linear_act", "sdpa"},
}


def optimized_equals_eager(module, args, tol=1e-4):
    f = saturate_and_extract(module, profile_db=False, profile_budget=0)  # no timing: no speed fallback
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, ref = f(*args), module(*args)
    assert f.report.optimized, f.report.fallback
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    return f.report


@pytest.mark.parametrize("name", [n for n in FUSES if n not in ("mistral", "qwen2")])  # LLaMA's graph
def test_model_optimizes_to_eager_with_its_fusions(name):
    report = optimized_equals_eager(*build(name, 16, c=32, layers=1))
    assert FUSES[name] <= set(report.ops_after), sorted(report.ops_after)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_eager_attention_fuses_as_sdpa_does(name):
    """transformers' own attention (matmul, scale, mask, softmax in float32, GQA's repeat_kv)."""
    report = optimized_equals_eager(*build(name, 16, attn="eager", c=32, layers=1))
    assert FUSES[name] <= set(report.ops_after), sorted(report.ops_after)


@pytest.mark.parametrize("name", ["llama", "opt"])
def test_left_padded_batch_validates(name):
    """A padded query sees no key: torch's attention gives 0 there, and so must the plan."""
    report = optimized_equals_eager(*build(name, 16, padded=True, c=32, layers=1))
    assert "sdpa_masked" in report.ops_after


@pytest.mark.parametrize("name,attn", [("llama", "sdpa"), ("bert", "sdpa"), ("llama", "eager")])
def test_bfloat16_model_keeps_its_dtype_and_values(name, attn):
    """A boolean mask's 0 / -inf are float32 consts: the fully-masked-row guard must not promote
    the attention's output (a float32 activation met a bfloat16 weight in the next matmul). The
    eager attention's masked softmax in float32 fuses as sdpa of float32 copies."""
    module, args = build(name, 16, attn, padded=name != "bert", c=32, layers=1, dtype=torch.bfloat16)
    report = optimized_equals_eager(module, args, tol=5e-2)  # bfloat16's 2^-8, rounded per op
    assert FUSES[name] - {"linear_act"} <= set(report.ops_after), sorted(report.ops_after)
