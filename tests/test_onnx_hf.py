"""Hugging Face architectures we wrote no rule around, exported by torch.onnx.export(dynamo=True):
optimized at --opset 23 they compute what the original computes under onnxruntime, and their
attention, norms and activations come out as the fused operators (also used by bench/onnx_hf.py)."""
from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

WIDTH, HEADS, LAYERS, VOCAB = 64, 4, 2, 1000


class CausalLM(torch.nn.Module):
    """input_ids -> last hidden state with an all-ones mask and no cache (what the exporter traces)."""

    def __init__(self, model, cache: bool = True):
        super().__init__()
        self.model, self.cache = model, cache

    def forward(self, ids):
        extra = {"use_cache": False} if self.cache else {}
        return self.model(input_ids=ids, attention_mask=torch.ones_like(ids), return_dict=False, **extra)[0]


class Encoder(torch.nn.Module):
    """A vision or audio encoder: its one float input -> last hidden state."""

    def __init__(self, model, keyword: str):
        super().__init__()
        self.model, self.keyword = model, keyword

    def forward(self, x):
        return self.model(**{self.keyword: x}, return_dict=False)[0]


def _decoder(config_name: str, model_name: str, **extra):
    """A decoder-only model in its own config's spelling of width, heads and layers."""
    t = transformers
    config = getattr(t, config_name)(vocab_size=VOCAB, hidden_size=WIDTH, num_attention_heads=HEADS,
                                     num_hidden_layers=LAYERS, intermediate_size=4 * WIDTH,
                                     max_position_embeddings=128, **extra)
    return CausalLM(getattr(t, model_name)(config))


def _ids(length: int):
    return (torch.randint(0, VOCAB, (1, length)),)


def _models():
    """name -> (builder of the module, builder of its inputs at a length)."""
    t = transformers
    gqa = {"num_key_value_heads": 2}
    return {
        "llama": (lambda: _decoder("LlamaConfig", "LlamaModel", **gqa), _ids),
        "mistral": (lambda: _decoder("MistralConfig", "MistralModel", sliding_window=None, **gqa), _ids),
        "qwen2": (lambda: _decoder("Qwen2Config", "Qwen2Model", **gqa), _ids),
        "gemma": (lambda: _decoder("GemmaConfig", "GemmaModel", head_dim=WIDTH // HEADS, **gqa), _ids),
        "phi3": (lambda: _decoder("Phi3Config", "Phi3Model", pad_token_id=0, eos_token_id=0, bos_token_id=0,
                                               **gqa), _ids),
        "gpt_neox": (lambda: _decoder("GPTNeoXConfig", "GPTNeoXModel"), _ids),
        "opt": (lambda: CausalLM(t.OPTModel(t.OPTConfig(
            vocab_size=VOCAB, hidden_size=WIDTH, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
            ffn_dim=4 * WIDTH, word_embed_proj_dim=WIDTH, max_position_embeddings=128, pad_token_id=0))), _ids),
        "bloom": (lambda: CausalLM(t.BloomModel(t.BloomConfig(
            vocab_size=VOCAB, hidden_size=WIDTH, n_head=HEADS, n_layer=LAYERS))), _ids),
        "falcon": (lambda: CausalLM(t.FalconModel(t.FalconConfig(
            vocab_size=VOCAB, hidden_size=WIDTH, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
            new_decoder_architecture=False, multi_query=True, alibi=False))), _ids),
        "t5_encoder": (lambda: CausalLM(t.T5EncoderModel(t.T5Config(
            vocab_size=VOCAB, d_model=WIDTH, d_kv=WIDTH // HEADS, d_ff=4 * WIDTH, num_heads=HEADS,
            num_layers=LAYERS)), cache=False), _ids),
        "roberta": (lambda: CausalLM(t.RobertaModel(t.RobertaConfig(
            vocab_size=VOCAB, hidden_size=WIDTH, num_attention_heads=HEADS, num_hidden_layers=LAYERS,
            intermediate_size=4 * WIDTH, max_position_embeddings=130)), cache=False), _ids),
        "distilbert": (lambda: CausalLM(t.DistilBertModel(t.DistilBertConfig(
            vocab_size=VOCAB, dim=WIDTH, n_heads=HEADS, n_layers=LAYERS, hidden_dim=4 * WIDTH,
            max_position_embeddings=128)), cache=False), _ids),
        "vit": (lambda: Encoder(t.ViTModel(t.ViTConfig(
            hidden_size=WIDTH, num_attention_heads=HEADS, num_hidden_layers=LAYERS, intermediate_size=4 * WIDTH,
            image_size=32, patch_size=8), add_pooling_layer=False), "pixel_values"),
            lambda length: (torch.randn(1, 3, 32, 32),)),
        "whisper_encoder": (lambda: Encoder(t.WhisperModel(t.WhisperConfig(
            vocab_size=VOCAB, d_model=WIDTH, encoder_attention_heads=HEADS, encoder_layers=LAYERS,
            decoder_layers=1, decoder_attention_heads=HEADS, encoder_ffn_dim=4 * WIDTH,
            decoder_ffn_dim=4 * WIDTH, num_mel_bins=16, max_source_positions=32, pad_token_id=0,
            bos_token_id=0, eos_token_id=0, decoder_start_token_id=0)).get_encoder(),
            "input_features"), lambda length: (torch.randn(1, 16, 64),)),
    }


MODELS = list(_models())
#: what the tests run: Mistral and Qwen2 are LLaMA's graph under other names (bench/onnx_hf.py runs them)
TESTED = [name for name in MODELS if name not in ("mistral", "qwen2")]


def export_model(name: str, folder: Path, length: int = 32) -> str:
    """Export one model (random weights, seed 0, eval mode) to folder/hf_{name}_{length}.onnx."""
    build, inputs = _models()[name]
    torch.manual_seed(0)
    module = build().eval()
    path = str(Path(folder) / f"hf_{name}_{length}.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs(length), dynamo=True).save(path)
    return path


#: the fused operators each optimized model holds at --opset 23 (2 layers; a final norm where the
#: model has one)
EXPECTED = {
    **{name: {"Attention": 2, "RMSNormalization": 5, "RotaryEmbedding": 4} for name in ("llama", "mistral", "qwen2", "phi3")},
    "t5_encoder": {"Attention": 2, "RMSNormalization": 5},
    "gemma": {"Attention": 2, "RMSNormalization": 5, "Gelu": 2, "RotaryEmbedding": 4},
    "gpt_neox": {"Attention": 2, "LayerNormalization": 3, "Gelu": 2, "RotaryEmbedding": 4},
    "falcon": {"Attention": 2, "LayerNormalization": 3, "Gelu": 2, "RotaryEmbedding": 4},
    "opt": {"Attention": 2, "LayerNormalization": 5},
    "bloom": {"Attention": 2, "LayerNormalization": 6, "Gelu": 2},  # alibi through baddbmm; its tanh gelu
    **{name: {"Attention": 2, "LayerNormalization": 5, "Gelu": 2} for name in ("roberta", "distilbert", "vit")},
    "whisper_encoder": {"Attention": 2, "LayerNormalization": 5, "Gelu": 4},
}


@pytest.mark.parametrize("name", TESTED)
def test_hugging_face_export_fuses_and_matches_onnxruntime(tmp_path, name):
    """Optimized at --opset 23 by the batch driver (static prices: what a busy machine measures
    does not decide), each architecture computes the original's outputs under onnxruntime, and its
    attention, norms and gelu are the fused operators (no Softmax left where Attention is)."""
    import numpy as np
    import onnx

    from egraph_opt.drivers.onnx_batch import process, random_feeds, session

    path, target = export_model(name, tmp_path, 16), str(tmp_path / "optimized.onnx")
    record = process(path, target, {"force": True, "objective": "balanced", "seed": 0, "latency_runs": 0,
                                    "profile_db": str(tmp_path / "p.sqlite"), "profile_budget": 0, "opset": 23})
    assert record["status"] == "optimized", record["reason"]
    model = onnx.load(target)
    ops = [n.op_type for n in model.graph.node]
    assert {op: ops.count(op) for op in EXPECTED[name]} == EXPECTED[name]
    assert "Attention" not in EXPECTED[name] or "Softmax" not in ops
    assert record["nodes_after"] < record["nodes_before"]
    feeds = random_feeds(onnx.load(path), seed=3)
    (expected,), (got,) = session(path).run(None, feeds), session(model).run(None, feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
