"""Hugging Face models through the torch decorator: programs our rules were not written around.

Each architecture is a tiny random-weight config built in code (no downloads), in eval mode; its
forward on input ids (pixel values, audio features) is optimized by ``saturate_and_extract`` and
one row is printed: ops before -> after, the fused ops that appeared, the fallback reason if any,
the largest difference from eager, the optimize seconds and a rough speedup (interleaved medians;
the machine is shared, figures are indicative). ``MODELS[name]()`` gives ``(module, args)``, the
module returning the model's last hidden state; ``tests/test_hf_models.py`` checks them.

    python bench/hf_models.py [--only NAME ...] [--length T] [--repeats N] [--attn sdpa|eager]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import torch
import transformers as tf
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fusion import interleaved  # noqa: E402

from egraph_opt import saturate_and_extract  # noqa: E402

V, C, HEADS, KV, FF, LAYERS = 1000, 128, 4, 2, 256, 2
#: ops that are a fusion of something the model spells out (what the row lists as fused)
FUSED = ("sdpa", "layer_norm", "rms_norm", "gelu", "rotary", "swiglu", "geglu", "linear_act",
         "softmax", "log_softmax", "silu")
DECODERS = {  # causal LMs taking input ids, built from their config class with common sizes
    "llama": ("LlamaConfig", "LlamaModel", {}),
    "mistral": ("MistralConfig", "MistralModel", {}),
    "qwen2": ("Qwen2Config", "Qwen2Model", {}),
    "gemma": ("GemmaConfig", "GemmaModel", {"head_dim": C // HEADS}),
    "gemma2": ("Gemma2Config", "Gemma2Model", {"head_dim": C // HEADS}),
    "phi3": ("Phi3Config", "Phi3Model", {}),
    "phi": ("PhiConfig", "PhiModel", {}),
}
OTHERS = {  # name: (config class, model class, config arguments, input kind)
    "gpt2": ("GPT2Config", "GPT2Model", dict(n_layer=LAYERS, n_embd=C, n_head=HEADS, vocab_size=V,
                                              n_positions=256), "ids"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXModel", dict(
        hidden_size=C, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
        vocab_size=V), "ids"),
    "opt": ("OPTConfig", "OPTModel", dict(hidden_size=C, num_hidden_layers=LAYERS, ffn_dim=FF,
                                          num_attention_heads=HEADS, vocab_size=V,
                                          word_embed_proj_dim=C), "ids"),
    "bloom": ("BloomConfig", "BloomModel", dict(hidden_size=C, n_layer=LAYERS, n_head=HEADS,
                                                vocab_size=V), "ids"),
    "falcon": ("FalconConfig", "FalconModel", dict(hidden_size=C, num_hidden_layers=LAYERS,
                                                   num_attention_heads=HEADS, vocab_size=V), "ids"),
    "bert": ("BertConfig", "BertModel", dict(hidden_size=C, num_hidden_layers=LAYERS,
                                             num_attention_heads=HEADS, intermediate_size=FF,
                                             vocab_size=V), "ids"),
    "roberta": ("RobertaConfig", "RobertaModel", dict(
        hidden_size=C, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
        vocab_size=V), "ids"),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(dim=C, n_layers=LAYERS, n_heads=HEADS,
                                                               hidden_dim=FF, vocab_size=V), "ids"),
    "t5_encoder": ("T5Config", "T5EncoderModel", dict(d_model=C, d_kv=C // HEADS, d_ff=FF,
                                                      num_layers=LAYERS, num_heads=HEADS,
                                                      vocab_size=V), "ids"),
    "clip_text": ("CLIPTextConfig", "CLIPTextModel", dict(
        hidden_size=C, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
        vocab_size=V), "ids"),
    "vit": ("ViTConfig", "ViTModel", dict(hidden_size=C, num_hidden_layers=LAYERS,
                                          num_attention_heads=HEADS, intermediate_size=FF,
                                          image_size=32, patch_size=8), "pixels"),
    "whisper_encoder": ("WhisperConfig", "WhisperEncoderModel", dict(
        d_model=C, encoder_layers=LAYERS, encoder_attention_heads=HEADS, encoder_ffn_dim=FF,
        decoder_layers=1, decoder_attention_heads=HEADS, num_mel_bins=16,
        max_source_positions=64, vocab_size=V), "audio"),
}


class LastHidden(nn.Module):
    """The model's last hidden state: one tensor out, whatever output class the model returns."""

    def __init__(self, model: nn.Module, **kwargs):
        super().__init__()
        self.model, self.kwargs = model, kwargs

    def forward(self, x):
        return self.model(x, return_dict=False, **self.kwargs)[0]


def build(name: str, t: int = 32, attn: str = "sdpa") -> tuple[nn.Module, tuple]:
    """``(module, args)`` for architecture ``name`` at sequence length ``t`` (random weights)."""
    torch.manual_seed(0)
    if name in DECODERS:
        config_cls, model_cls, extra = DECODERS[name]
        args = dict(hidden_size=C, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                    num_key_value_heads=KV, intermediate_size=FF, vocab_size=V, **extra)
        kind, kwargs = "ids", {"use_cache": False}
    else:
        config_cls, model_cls, args, kind = OTHERS[name]
        kwargs = {"use_cache": False} if name in ("gpt2", "gpt_neox", "opt", "bloom", "falcon") else {}
    tokens = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)  # within the tiny vocabulary
    model_cls = getattr(tf, model_cls) if hasattr(tf, model_cls) else \
        getattr(tf.models.whisper.modeling_whisper, "WhisperEncoder")
    try:
        model = model_cls(getattr(tf, config_cls)(**args, **tokens, attn_implementation=attn))
    except ValueError:  # Gemma2, BLOOM: no sdpa path, their own (eager) attention
        model = model_cls(getattr(tf, config_cls)(**args, **tokens, attn_implementation="eager"))
    config, model = model.config, model.eval()
    if kind == "ids":
        x = torch.randint(0, V, (2, t))
    elif kind == "pixels":
        x = torch.randn(2, 3, 32, 32)
    else:  # whisper's encoder: its convolutions halve 2 * max_source_positions frames
        x = torch.randn(2, 16, 2 * config.max_source_positions)
    return LastHidden(model, **kwargs).eval(), (x,)


MODELS = {name: (lambda n: lambda t=32, attn="sdpa": build(n, t, attn))(name)
          for name in [*DECODERS, *OTHERS]}


def row(name: str, t: int, attn: str, repeats: int) -> None:
    module, args = build(name, t, attn)
    optimized = saturate_and_extract(module)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = module(*args)
        start = time.perf_counter()
        try:
            out = optimized(*args)
        except Exception as e:  # noqa: BLE001 - a crash is this row's finding
            print(f"{name:<16} CRASH {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
            return
        seconds = time.perf_counter() - start
        report = optimized.report
        err = (out - ref).abs().max().item()
        before, after = (sum(d.values()) for d in (report.ops_before, report.ops_after))
        fused = sorted(op for op in report.ops_after if any(op.startswith(f) for f in FUSED))
        speed = ""
        if repeats:
            times = interleaved({"orig": module, "opt": optimized}, args, repeats)
            speed = f"{statistics.median(times['orig']) / statistics.median(times['opt']):5.2f}x"
    status = "FALLBACK " + report.fallback[:100] if report.fallback else "ok"
    print(f"{name:<16} {before:>5} -> {after:<5} {err:9.2e} {seconds:7.1f} {speed:>6}  "
          f"{','.join(fused) or '-':<40} {status}", flush=True)
    if report.opaque:
        print(f"{'':<16} opaque: {'; '.join(report.opaque)[:200]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", choices=list(MODELS))
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--repeats", type=int, default=20, help="0: no timing")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    a = p.parse_args()
    print(f"T={a.length} C={C} layers={LAYERS} attn={a.attn} threads={torch.get_num_threads()}")
    print(f"{'model':<16} {'ops':>5}    {'after':<5} {'max err':>9} {'opt s':>7} {'speed':>6}  "
          f"{'fused ops':<40} status")
    for name in a.only or MODELS:
        row(name, a.length, a.attn, a.repeats)


if __name__ == "__main__":
    main()
