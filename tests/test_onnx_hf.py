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
