"""Hugging Face architectures outside ``hf_models.py``'s suite, called as users call them: the model as instantiated
(a tiny random config built in code) with default arguments, and, for those that generate, a greedy ``generate()``
through a decorated ``model.forward``. One row each: the fallback (empty: optimized), the largest difference from
eager, a rough speedup (interleaved medians: indicative), and for generation whether the tokens are eager's and the
plans' fallbacks. Session 31 ran these and found thirteen bugs (README, the hf_models row).

    python bench/hf_more.py [--only NAME ...] [--threads N] [--rounds N]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import transformers as tf

from egraph_opt import saturate_and_extract

V = 1000
H = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
S2S = dict(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
           decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128)
LM = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2)


def ids(b: int = 2, t: int = 16) -> torch.Tensor:
    return torch.randint(3, V, (b, t))


def pixels(size: int = 32) -> dict:
    return {"pixel_values": torch.randn(2, 3, size, size)}


def _llava():
    vision = tf.CLIPVisionConfig(image_size=32, patch_size=8, **H)
    return tf.LlavaForConditionalGeneration(tf.LlavaConfig(vision_config=vision, text_config=tf.LlamaConfig(**LM),
                                                           image_token_index=V - 1, vision_feature_layer=-1))


def _llava_inputs() -> dict:
    tokens = ids(1, 24)
    tokens[0, 2:18] = V - 1  # one image token per patch: (32 / 8) ** 2
    return {"input_ids": tokens, "pixel_values": torch.randn(1, 3, 32, 32)}


#: name -> (generates, the model, its inputs)
MODELS = {
    "BART": (True, lambda: tf.BartForConditionalGeneration(tf.BartConfig(**S2S)), lambda: {"input_ids": ids()}),
    "mBART": (True, lambda: tf.MBartForConditionalGeneration(tf.MBartConfig(**S2S)), lambda: {"input_ids": ids()}),
    "PLBart": (True, lambda: tf.PLBartForConditionalGeneration(tf.PLBartConfig(**S2S)), lambda: {"input_ids": ids()}),
    "Pegasus": (True, lambda: tf.PegasusForConditionalGeneration(tf.PegasusConfig(**S2S)),
                lambda: {"input_ids": ids(), "decoder_input_ids": ids(2, 4)}),
    "M2M100": (True, lambda: tf.M2M100ForConditionalGeneration(tf.M2M100Config(**S2S)),
               lambda: {"input_ids": ids(), "decoder_input_ids": ids(2, 4)}),
    "ProphetNet": (True, lambda: tf.ProphetNetForConditionalGeneration(tf.ProphetNetConfig(
        vocab_size=V, hidden_size=64, encoder_ffn_dim=128, decoder_ffn_dim=128, num_encoder_layers=2, num_decoder_layers=2,
        num_encoder_attention_heads=4, num_decoder_attention_heads=4, max_position_embeddings=128, ngram=2)),
        lambda: {"input_ids": ids(), "decoder_input_ids": ids(2, 4)}),
    "Whisper": (False, lambda: tf.WhisperForConditionalGeneration(tf.WhisperConfig(
        vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32, max_target_positions=64,
        decoder_start_token_id=1, pad_token_id=0, eos_token_id=2, bos_token_id=1)),
        lambda: {"input_features": torch.randn(2, 16, 64), "decoder_input_ids": ids(2, 4)}),
    "Mixtral": (True, lambda: tf.MixtralForCausalLM(tf.MixtralConfig(**LM, num_local_experts=4, num_experts_per_tok=2)),
                lambda: {"input_ids": ids()}),
    "DeepseekV3": (True, lambda: tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
        **{**LM, "num_key_value_heads": 4}, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, first_k_dense_replace=1)), lambda: {"input_ids": ids()}),
    "Qwen3MoE": (True, lambda: tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
        **LM, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, head_dim=16)), lambda: {"input_ids": ids()}),
    "OPT": (True, lambda: tf.OPTForCausalLM(tf.OPTConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
                                                         num_attention_heads=4, ffn_dim=128, word_embed_proj_dim=64)),
            lambda: {"input_ids": ids()}),
    "Falcon": (True, lambda: tf.FalconForCausalLM(tf.FalconConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
                                                                  num_attention_heads=4)), lambda: {"input_ids": ids()}),
    "CTRL": (True, lambda: tf.CTRLLMHeadModel(tf.CTRLConfig(vocab_size=V, n_embd=64, n_layer=2, n_head=4, dff=128)),
             lambda: {"input_ids": ids()}),
    "XLNet": (True, lambda: tf.XLNetLMHeadModel(tf.XLNetConfig(vocab_size=V, d_model=64, n_layer=2, n_head=4,
                                                                d_inner=128)), lambda: {"input_ids": ids()}),
    "Mamba": (True, lambda: tf.MambaForCausalLM(tf.MambaConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
                                                              state_size=8)), lambda: {"input_ids": ids()}),
    "RWKV": (True, lambda: tf.RwkvForCausalLM(tf.RwkvConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
                                                           attention_hidden_size=64, intermediate_size=128,
                                                           context_length=64)), lambda: {"input_ids": ids()}),
    "Cohere2": (True, lambda: tf.Cohere2ForCausalLM(tf.Cohere2Config(
        **LM, sliding_window=8, layer_types=["sliding_attention", "full_attention"])), lambda: {"input_ids": ids()}),
    "GptOss": (True, lambda: tf.GptOssForCausalLM(tf.GptOssConfig(
        **LM, num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"])), lambda: {"input_ids": ids()}),
    "LLaVA": (True, _llava, _llava_inputs),
    "BigBird": (False, lambda: tf.BigBirdModel(tf.BigBirdConfig(vocab_size=V, attention_type="original_full", **H)),
                lambda: {"input_ids": ids()}),
    "MarkupLM": (False, lambda: tf.MarkupLMModel(tf.MarkupLMConfig(vocab_size=V, **H)), lambda: {"input_ids": ids()}),
    "DistilBERT+labels": (False, lambda: tf.DistilBertForSequenceClassification(tf.DistilBertConfig(
        vocab_size=V, dim=64, n_layers=2, n_heads=4, hidden_dim=128)),
        lambda: {"input_ids": ids(), "labels": torch.tensor([0, 1])}),
    "PatchTST": (False, lambda: tf.PatchTSTModel(tf.PatchTSTConfig(
        num_input_channels=3, context_length=32, patch_length=8, patch_stride=8, d_model=32, num_attention_heads=4,
        num_hidden_layers=2, ffn_dim=64)), lambda: {"past_values": torch.randn(2, 32, 3)}),
    "Swin2SR": (False, lambda: tf.Swin2SRModel(tf.Swin2SRConfig(image_size=16, patch_size=1, embed_dim=16, depths=[2],
                                                                num_heads=[2], window_size=4)),
                lambda: {"pixel_values": torch.randn(1, 3, 16, 16)}),
    "MobileViTV2": (False, lambda: tf.MobileViTV2Model(tf.MobileViTV2Config(image_size=64, width_multiplier=0.5)),
                    lambda: pixels(64)),
    "PVT": (False, lambda: tf.PvtModel(tf.PvtConfig(image_size=64, num_encoder_blocks=2, depths=[1, 1],
                                                    sequence_reduction_ratios=[2, 1], hidden_sizes=[16, 32],
                                                    patch_sizes=[4, 2], strides=[4, 2], num_attention_heads=[1, 2],
                                                    mlp_ratios=[2, 2])), lambda: pixels(64)),
}


def _first(out) -> torch.Tensor:
    return out[next(iter(out.keys()))] if hasattr(out, "keys") else out[0]


def row(name: str, rounds: int) -> str:
    generates, make, inputs = MODELS[name]
    torch.manual_seed(0)
    m, kwargs = make().eval(), inputs()
    f = saturate_and_extract(m)
    with torch.no_grad():
        error = (_first(f(**kwargs)) - _first(m(**kwargs))).abs().max().item()
        ratios = []
        for _ in range(rounds):  # eager, then decorated: the median of the pairs' ratios
            start = time.perf_counter()
            m(**kwargs)
            middle = time.perf_counter()
            f(**kwargs)
            ratios.append((middle - start) / (time.perf_counter() - middle))
    text = f"{name:<18} call {statistics.median(ratios):5.2f}x  error {error:.1e}  fallback {f.report.fallback[:90]!r}"
    if generates:
        short = {k: v[:1, :8] if k == "input_ids" and name != "LLaVA" else v[:1] for k, v in kwargs.items()
                 if k in ("input_ids", "pixel_values")}
        eager = m.generate(**short, max_new_tokens=6, do_sample=False)
        forward = m.forward
        m.forward = saturate_and_extract(forward)
        try:
            tokens = m.generate(**short, max_new_tokens=6, do_sample=False)
            plans = sorted({(p.report.fallback or "optimized")[:60] for p in m.forward.plans.values()})
        finally:
            m.forward = forward
        text += f"\n{'':<18} generate: tokens {'= eager' if torch.equal(tokens, eager) else 'DIFFER'}, plans {plans}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    tf.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    for name in args.only or MODELS:
        try:
            print(row(name, args.rounds), flush=True)
        except Exception as e:  # noqa: BLE001 - a row per model: one that fails says why and the rest run
            print(f"{name:<18} ERROR {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)


if __name__ == "__main__":
    main()
