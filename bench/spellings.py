"""The public suite of spellings (issue 17 item 5): attention, layer norm / RMSNorm and gelu as
popular repositories write them, each a plain torch function or module with an input builder.

Cores are transcribed from karpathy/nanoGPT and minGPT (model.py), huggingface/transformers
(models/gpt2, bert, llama, t5, gemma; activations.py), huggingface/pytorch-image-models
(timm/layers/attention.py) and NVIDIA Megatron-LM (fused_bias_gelu), cut to the attention, norm or
gelu itself, and the gated MLPs, cross-entropy and rotary embedding LLaMA-style models carry.
``spellings_sourced.py`` adds those read in other projects' sources: ONNX Runtime's fusion
patterns, xformers' reference attentions and ten more model families' eager attention.
Weights are random, built in code. ``SUITE[name].make(t)`` gives ``(fn, args)`` at
sequence length ``t``; ``fuses`` names the fused op the optimized program must contain.
``tests/test_spellings.py`` checks every entry, ``bench/fusion.py --suite`` times them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

B, H, D = 2, 4, 16
C = H * D


@dataclass(frozen=True)
class Spelling:
    name: str
    family: str  # one of FAMILIES
    source: str  # where it is written this way
    make: Callable[[int], tuple]  # t -> (fn, args)
    fuses: tuple[str, ...]  # one of these ops must be in the optimized program


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    return (torch.randn(*shape, generator=_gen(seed)) * scale).to(dtype)


def _qkv(t, dtype=torch.float32, heads=H, kv_heads=None):
    kvh = kv_heads or heads
    return (_randn(B, heads, t, D, dtype=dtype, seed=1), _randn(B, kvh, t, D, dtype=dtype, seed=2),
            _randn(B, kvh, t, D, dtype=dtype, seed=3))


def _module(cls, *args):
    torch.manual_seed(0)
    return cls(*args).eval()


# ---- attention ----------------------------------------------------------------------------------
class NanoGPTAttention(nn.Module):
    """karpathy/nanoGPT model.py CausalSelfAttention; ``flash`` takes its sdpa path."""

    def __init__(self, t, flash=False):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.0), nn.Dropout(0.0)
        self.n_head, self.n_embd, self.dropout, self.flash = H, C, 0.0, flash
        self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MinGPTAttention(nn.Module):
    """karpathy/minGPT mingpt/model.py (first version): separate key, query, value projections."""

    def __init__(self, t):
        super().__init__()
        self.key, self.query, self.value = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
        self.attn_drop, self.resid_drop, self.proj = nn.Dropout(0.1), nn.Dropout(0.1), nn.Linear(C, C)
        self.register_buffer("mask", torch.tril(torch.ones(t, t)).view(1, 1, t, t))
        self.n_head = H

    def forward(self, x):
        B, T, C = x.size()
        k = self.key(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = self.query(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = self.value(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        att = self.attn_drop(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class TimmAttention(nn.Module):
    """huggingface/pytorch-image-models timm/layers/attention.py Attention (fused_attn off/on)."""

    def __init__(self, fused=False):
        super().__init__()
        self.num_heads, self.head_dim, self.fused_attn = H, D, fused
        self.scale = self.head_dim ** -0.5
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.attn_drop, self.proj_drop = nn.Dropout(0.0), nn.Dropout(0.0)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
        else:
            q = q * self.scale
            attn = q @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            attn = self.attn_drop(attn)
            x = attn @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


def gpt2_eager(query, key, value, bias):
    """transformers models/gpt2 GPT2Attention._attn (v4.3x): where(causal, w, finfo.min)."""
    attn_weights = torch.matmul(query, key.transpose(-1, -2))
    attn_weights = attn_weights / torch.full([], value.size(-1) ** 0.5, dtype=attn_weights.dtype,
                                             device=attn_weights.device)
    query_length, key_length = query.size(-2), key.size(-2)
    causal_mask = bias[:, :, key_length - query_length: key_length, :key_length]
    mask_value = torch.finfo(attn_weights.dtype).min
    mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
    attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = attn_weights.type(value.dtype)
    return torch.matmul(attn_weights, value)


def gpt2_where_float(query, key, value, bias):
    """GPT-2's causal where with the fill as a Python float (finfo.min), scale as a float."""
    w = torch.matmul(query, key.transpose(-1, -2)) / (value.size(-1) ** 0.5)
    w = torch.where(bias, w, torch.finfo(w.dtype).min)
    return torch.matmul(F.softmax(w, dim=-1), value)


def bert_eager(query_layer, key_layer, value_layer, attention_mask):
    """transformers models/bert BertSelfAttention (eager): additive extended mask (B, 1, 1, T)."""
    attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
    attention_scores = attention_scores / math.sqrt(query_layer.size(-1))
    attention_scores = attention_scores + attention_mask
    attention_probs = nn.functional.softmax(attention_scores, dim=-1)
    attention_probs = F.dropout(attention_probs, p=0.1, training=False)
    return torch.matmul(attention_probs, value_layer)


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """transformers models/llama repeat_kv: GQA heads by expand + reshape."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def llama_eager(query, key, value, attention_mask):
    """transformers models/llama eager_attention_forward: GQA, additive causal mask, softmax in
    float32, dropout(p=0.0, training=False)."""
    scaling = query.size(-1) ** -0.5
    key_states, value_states = repeat_kv(key, 2), repeat_kv(value, 2)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = attn_weights + causal_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=0.0, training=False)
    return torch.matmul(attn_weights, value_states)


def llama_no_mask(query, key, value):
    return llama_eager(query, key, value, None)


def _scaled(spell):
    """q, k, v attention whose scores ``spell`` writes."""
    return lambda q, k, v: torch.softmax(spell(q, k), -1) @ v


_PLAIN = {  # name -> (scores of q and k, source)
    "scale-q-pow": (lambda q, k: (q * q.size(-1) ** -0.5) @ k.transpose(-2, -1), "timm: q * scale"),
    "scale-k-pow": (lambda q, k: q @ (k * k.size(-1) ** -0.5).transpose(-2, -1), "scale on k"),
    "scale-both": (lambda q, k: (q * D ** -0.25) @ (k * D ** -0.25).transpose(-2, -1),
                   "x-transformers/perceiver: d^-1/4 on both"),
    "scale-k-transposed": (lambda q, k: q @ (k.transpose(-2, -1) * D ** -0.5), "scale on k^T"),
    "div-sqrt-after": (lambda q, k: (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1)), "BERT"),
    "div-q-first": (lambda q, k: (q / math.sqrt(D)) @ k.transpose(-2, -1), "fairseq-style"),
    "scale-left": (lambda q, k: D ** -0.5 * (q @ k.mT), "scalar first, .mT"),
    "div-tensor-scale": (lambda q, k: q @ k.transpose(-2, -1) / torch.sqrt(torch.tensor(float(D))),
                         "divide by a tensor sqrt(d)"),
    "unscaled": (lambda q, k: q @ k.transpose(-1, -2), "no scale"),
    "permute-k": (lambda q, k: q @ k.permute(0, 1, 3, 2) * D ** -0.5, "K by permute"),
}


def _shifted(q, k, v):
    s = q @ k.transpose(-2, -1) * D ** -0.5
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True) @ v


def _naive_exp(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(D)
    return torch.exp(s) / torch.exp(s).sum(-1, keepdim=True) @ v


def _dropout_p0(q, k, v):
    p = torch.softmax(q @ k.transpose(-2, -1) * D ** -0.5, -1)
    return F.dropout(p, p=0.0) @ v


def _softmax_float_in_half(q, k, v):
    s = q @ k.transpose(-2, -1) * D ** -0.5
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def _softmax_type_as(q, k, v):
    s = q @ k.transpose(-2, -1) * D ** -0.5
    return F.softmax(s.float(), dim=-1).type_as(s) @ v


def _causal_triu(q, k, v):
    T = q.size(-2)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), diagonal=1)
    s = (q @ k.transpose(-2, -1) * D ** -0.5).masked_fill(mask, float("-inf"))
    return torch.softmax(s, -1) @ v


def _causal_full_additive(q, k, v):
    T = q.size(-2)
    mask = torch.full((T, T), float("-inf"), device=q.device).triu(1)
    return torch.softmax(q @ k.transpose(-2, -1) * D ** -0.5 + mask, -1) @ v


def _causal_tril_eq0(q, k, v):
    T = q.size(-2)
    tril = torch.tril(torch.ones(T, T, device=q.device))
    s = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(tril == 0, float("-inf"))
    return torch.softmax(s, -1) @ v


def _annotated_transformer(query, key, value, mask):
    """harvardnlp/annotated-transformer attention(): masked_fill(mask == 0, -1e9), a finite fill."""
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    scores = scores.masked_fill(mask == 0, -1e9)
    return torch.matmul(scores.softmax(dim=-1), value)


def _subsequent(t):
    """The Annotated Transformer's subsequent_mask: uint8, 1 where a key may be seen."""
    return torch.tril(torch.ones(1, t, t, dtype=torch.uint8)).unsqueeze(1)


def _padding(t):
    """A padding mask (B, 1, 1, T): True where a key is a token, its last key padding."""
    keep = torch.ones(B, 1, 1, t, dtype=torch.bool)
    keep[..., -1] = False
    return keep


def _finfo_min_inside(q, k, v):
    T = q.size(-2)
    s = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), diagonal=1)
    return F.softmax(s.masked_fill(mask, torch.finfo(s.dtype).min), dim=-1) @ v


def _mask_fill_arg(q, k, v, mask):
    return torch.softmax((q @ k.transpose(-2, -1) * D ** -0.5).masked_fill(mask, float("-inf")), -1) @ v


def _additive_arg(q, k, v, bias):
    return torch.softmax(q @ k.transpose(-2, -1) * D ** -0.5 + bias, -1) @ v


def _bias_first(q, k, v, bias):
    return torch.softmax(bias + q @ k.transpose(-2, -1) * D ** -0.5, -1) @ v


def _bmm(q, k, v):
    b, h, t, d = q.shape
    q, k, v = (x.reshape(b * h, t, d) for x in (q, k, v))
    w = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * d ** -0.5, dim=-1)
    return torch.bmm(w, v).view(b, h, t, d)


def _einsum(q, k, v):
    s = torch.einsum("bhid,bhjd->bhij", q, k) * D ** -0.5
    return torch.einsum("bhij,bhjd->bhid", s.softmax(dim=-1), v)


def _single_head(q, k, v):
    return torch.softmax(q @ k.t() / math.sqrt(q.shape[-1]), dim=-1) @ v


def _div_q_odd(q, k, v):
    return torch.softmax((q / math.sqrt(q.size(-1))) @ k.transpose(-2, -1), -1) @ v


def _div_both_odd(q, k, v):
    d = q.size(-1)
    return torch.softmax((q / d ** 0.25) @ (k / d ** 0.25).transpose(-2, -1), -1) @ v


def _odd_qkv(t):
    return tuple(_randn(B, H, t, 24, seed=s) for s in (1, 2, 3))


def _gqa_repeat_interleave(q, k, v):
    """GQA as many write it: k, v heads by repeat_interleave (Mistral-style reference code)."""
    k, v = (x.repeat_interleave(q.size(1) // x.size(1), dim=1) for x in (k, v))
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v


def _sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _causal_bool(t):
    return torch.ones(t, t, dtype=torch.bool).triu(1)


def _additive_causal(t):
    return torch.zeros(1, 1, t, t).masked_fill(_causal_bool(t), torch.finfo(torch.float32).min)


_SDPA, _MASKED = ("sdpa",), ("sdpa", "sdpa_masked", "sdpa_filled")
_ATTENTION = [
    Spelling("nanogpt-masked-fill", "attention", "karpathy/nanoGPT CausalSelfAttention (slow path)",
             lambda t: (_module(NanoGPTAttention, t), (_randn(B, t, C),)), _MASKED),
    Spelling("nanogpt-flash", "attention", "karpathy/nanoGPT CausalSelfAttention (flash path)",
             lambda t: (_module(NanoGPTAttention, t, True), (_randn(B, t, C),)), _MASKED),
    Spelling("mingpt", "attention", "karpathy/minGPT CausalSelfAttention",
             lambda t: (_module(MinGPTAttention, t), (_randn(B, t, C),)), _MASKED),
    Spelling("timm-attention", "attention", "timm Attention (q * scale, fused_attn off)",
             lambda t: (_module(TimmAttention), (_randn(B, t, C),)), _SDPA),
    Spelling("timm-attention-fused", "attention", "timm Attention (fused_attn on)",
             lambda t: (_module(TimmAttention, True), (_randn(B, t, C),)), _SDPA),
    Spelling("gpt2-eager", "attention", "transformers GPT2Attention._attn: where(causal, w, finfo.min)",
             lambda t: (gpt2_eager, (*_qkv(t), ~_causal_bool(t).view(1, 1, t, t))), _MASKED),
    Spelling("gpt2-where-float", "attention", "GPT-2's where with a float fill",
             lambda t: (gpt2_where_float, (*_qkv(t), ~_causal_bool(t))), _MASKED),
    Spelling("bert-eager", "attention", "transformers BertSelfAttention: additive extended mask",
             lambda t: (bert_eager, (*_qkv(t), torch.zeros(B, 1, 1, t).index_fill(-1, torch.tensor([0]),
                                                                                  -10000.0))), _MASKED),
    Spelling("llama-eager-gqa", "attention", "transformers llama eager_attention_forward + repeat_kv",
             lambda t: (llama_eager, (*_qkv(t, kv_heads=H // 2), _additive_causal(t))), _MASKED),
    Spelling("llama-gqa-no-mask", "attention", "llama eager attention without a mask",
             lambda t: (llama_no_mask, _qkv(t, kv_heads=H // 2)), _SDPA),
    *(Spelling(name, "attention", src, lambda t, f=f: (_scaled(f), _qkv(t)), _SDPA)
      for name, (f, src) in _PLAIN.items()),
    Spelling("explicit-max-shift", "attention", "softmax written with its max shift",
             lambda t: (_shifted, _qkv(t)), _SDPA),
    Spelling("naive-exp", "attention", "exp / sum(exp)", lambda t: (_naive_exp, _qkv(t)), _SDPA),
    Spelling("dropout-p0", "attention", "F.dropout(p=0.0) between softmax and @ v",
             lambda t: (_dropout_p0, _qkv(t)), _SDPA),
    Spelling("softmax-float32-in-float16", "attention", "softmax(s.float()).to(q.dtype), float16",
             lambda t: (_softmax_float_in_half, _qkv(t, torch.float16)), _SDPA),
    Spelling("softmax-type-as", "attention", "softmax(s.float()).type_as(s), float16",
             lambda t: (_softmax_type_as, _qkv(t, torch.float16)), _SDPA),
    Spelling("causal-triu-inside", "attention", "mask = triu(ones(T, T, bool), 1); masked_fill",
             lambda t: (_causal_triu, _qkv(t)), _MASKED),
    Spelling("causal-full-additive", "attention", "full((T, T), -inf).triu(1) added",
             lambda t: (_causal_full_additive, _qkv(t)), _MASKED),
    Spelling("causal-tril-eq0", "attention", "masked_fill(tril(ones) == 0, -inf)",
             lambda t: (_causal_tril_eq0, _qkv(t)), _MASKED),
    Spelling("mask-fill-argument", "attention", "boolean mask passed in, masked_fill(-inf)",
             lambda t: (_mask_fill_arg, (*_qkv(t), _causal_bool(t))), _MASKED),
    Spelling("annotated-transformer-subsequent", "attention", "harvardnlp/annotated-transformer: "
             "masked_fill(mask == 0, -1e9), a uint8 subsequent mask",
             lambda t: (_annotated_transformer, (*_qkv(t), _subsequent(t))), _MASKED),
    Spelling("annotated-transformer-padding", "attention", "the same with a (B, 1, 1, T) padding mask",
             lambda t: (_annotated_transformer, (*_qkv(t), _padding(t))), _MASKED),
    Spelling("finfo-min-mask-inside", "attention", "causal mask built inside, masked_fill(mask, finfo.min)",
             lambda t: (_finfo_min_inside, _qkv(t)), _MASKED),
    Spelling("additive-mask-argument", "attention", "additive bias passed in",
             lambda t: (_additive_arg, (*_qkv(t), _additive_causal(t))), _MASKED),
    Spelling("bias-before-scores", "attention", "the additive mask written first: bias + q k^T * s",
             lambda t: (_bias_first, (*_qkv(t), _additive_causal(t))), _MASKED),
    Spelling("bmm-reshape", "attention", "torch.bmm over (B*H, T, D) reshapes",
             lambda t: (_bmm, _qkv(t)), _SDPA),
    Spelling("einsum", "attention", "x-transformers style einsum",
             lambda t: (_einsum, _qkv(t)), _SDPA),
    Spelling("single-head-3d", "attention", "one head, (T, D) tensors, k.t()",
             lambda t: (_single_head, tuple(x[0, 0] for x in _qkv(t))), _SDPA),
    Spelling("div-q-odd-head-dim", "attention", "(q / sqrt(d)) @ k^T, d = 24: not a power of two",
             lambda t: (_div_q_odd, _odd_qkv(t)), _SDPA),
    Spelling("div-both-odd-head-dim", "attention", "q / d^(1/4) and k / d^(1/4), d = 24",
             lambda t: (_div_both_odd, _odd_qkv(t)), _SDPA),
    Spelling("sdpa-causal", "attention", "F.scaled_dot_product_attention(is_causal=True)",
             lambda t: (_sdpa_causal, _qkv(t)), _SDPA),
    Spelling("gqa-repeat-interleave", "attention", "GQA: k, v repeat_interleave'd to q's heads",
             lambda t: (_gqa_repeat_interleave, _qkv(t, kv_heads=H // 2)), _SDPA),
    Spelling("llama-eager-float16", "attention", "transformers llama eager attention in float16: "
             "softmax(dtype=float32).to(query.dtype), GQA",
             lambda t: (llama_no_mask, _qkv(t, torch.float16, kv_heads=H // 2)), _SDPA),
]


# ---- layer norm and RMSNorm ---------------------------------------------------------------------
class NanoGPTLayerNorm(nn.Module):
    """karpathy/nanoGPT LayerNorm with an optional bias."""

    def __init__(self, ndim, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim) + 0.1 * torch.randn(ndim))
        self.bias = nn.Parameter(0.1 * torch.randn(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class TFStyleLayerNorm(nn.Module):
    """transformers (old BertLayerNorm, TF style) and ConvNeXt's channels-last LayerNorm."""

    def __init__(self, hidden_size, eps=1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size) + 0.1 * torch.randn(hidden_size))
        self.bias = nn.Parameter(0.1 * torch.randn(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.variance_epsilon)
        return self.weight * x + self.bias


class LlamaRMSNorm(nn.Module):
    """transformers models/llama LlamaRMSNorm."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size) + 0.1 * torch.randn(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class T5LayerNorm(nn.Module):
    """transformers models/t5 T5LayerNorm: RMS, no mean subtraction, no bias."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size) + 0.1 * torch.randn(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class GemmaRMSNorm(nn.Module):
    """transformers models/gemma GemmaRMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + weight)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(0.1 * torch.randn(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class MetaLlamaRMSNorm(nn.Module):
    """meta-llama/llama model.py RMSNorm: _norm(x.float()).type_as(x) * weight."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


def _half(module):
    return module.half()


def _wb(n=C):
    return 1 + 0.1 * _randn(n, seed=4), 0.1 * _randn(n, seed=5)


def _ln_mean_var(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def _ln_rsqrt(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + 1e-5) * w + b


def _ln_plain(x):
    mean = x.mean(-1, keepdim=True)
    var = torch.var(x, dim=-1, keepdim=True, correction=0)
    return (x - mean) / torch.sqrt(var + 1e-5)


def _rms_div_sqrt(x, w):
    return x / torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-6) * w


def _rms_functional(x, w):
    return F.rms_norm(x, (x.size(-1),), w, 1e-6)


def _rms_plain(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


def _rms_weight_float(x, w):
    """x.float(), normed, times weight.float(), back to the input dtype (small-LM tutorials)."""
    x_f = x.float()
    return (x_f * torch.rsqrt(x_f.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)


_LN, _RMS = ("layer_norm",), ("rms_norm",)
_NORM = [
    Spelling("f-layer-norm", "norm", "F.layer_norm",
             lambda t: (lambda x, w, b: F.layer_norm(x, (C,), w, b, 1e-5), (_randn(B, t, C), *_wb())), _LN),
    Spelling("nn-layer-norm", "norm", "nn.LayerNorm",
             lambda t: (_module(nn.LayerNorm, C), (_randn(B, t, C),)), _LN),
    Spelling("nanogpt-layer-norm", "norm", "karpathy/nanoGPT LayerNorm(bias=True)",
             lambda t: (_module(NanoGPTLayerNorm, C), (_randn(B, t, C),)), _LN),
    Spelling("tf-style-layer-norm", "norm", "BertLayerNorm / ConvNeXt: (x - u).pow(2).mean",
             lambda t: (_module(TFStyleLayerNorm, C), (_randn(B, t, C),)), _LN),
    Spelling("mean-var", "norm", "x.var(unbiased=False), divide by sqrt",
             lambda t: (_ln_mean_var, (_randn(B, t, C), *_wb())), _LN),
    Spelling("rsqrt-squared-mean", "norm", "((x - mean) ** 2).mean, times rsqrt",
             lambda t: (_ln_rsqrt, (_randn(B, t, C), *_wb())), _LN),
    Spelling("no-affine", "norm", "(x - mean) / sqrt(var + eps), no weight",
             lambda t: (_ln_plain, (_randn(B, t, C),)), _LN),
    Spelling("llama-rms-norm", "norm", "transformers LlamaRMSNorm",
             lambda t: (_module(LlamaRMSNorm, C), (_randn(B, t, C),)), _RMS),
    Spelling("t5-layer-norm", "norm", "transformers T5LayerNorm",
             lambda t: (_module(T5LayerNorm, C), (_randn(B, t, C),)), _RMS),
    Spelling("gemma-rms-norm", "norm", "transformers GemmaRMSNorm: (1 + weight)",
             lambda t: (_module(GemmaRMSNorm, C), (_randn(B, t, C),)), _RMS),
    Spelling("rms-div-sqrt", "norm", "x / sqrt(mean(x * x) + eps) * w",
             lambda t: (_rms_div_sqrt, (_randn(B, t, C), _wb()[0])), _RMS),
    Spelling("f-rms-norm", "norm", "F.rms_norm",
             lambda t: (_rms_functional, (_randn(B, t, C), _wb()[0])), _RMS),
    Spelling("nn-rms-norm", "norm", "nn.RMSNorm",
             lambda t: (_module(nn.RMSNorm, C), (_randn(B, t, C),)), _RMS),
    Spelling("rms-no-weight", "norm", "x * rsqrt(x.pow(2).mean + eps), no weight",
             lambda t: (_rms_plain, (_randn(B, t, C),)), _RMS),
    Spelling("llama-rms-norm-float16", "norm", "transformers LlamaRMSNorm in float16: .to(float32) "
             "inside, .to(input_dtype) before the weight",
             lambda t: (_half(_module(LlamaRMSNorm, C)), (_randn(B, t, C, dtype=torch.float16),)), _RMS),
    Spelling("t5-layer-norm-float16", "norm", "transformers T5LayerNorm in float16: the mean of "
             "squares in float32, x itself half",
             lambda t: (_half(_module(T5LayerNorm, C)), (_randn(B, t, C, dtype=torch.float16),)), _RMS),
    Spelling("gemma-rms-norm-float16", "norm", "GemmaRMSNorm in float16: x.float(), (1 + w.float()), type_as",
             lambda t: (_half(_module(GemmaRMSNorm, C)), (_randn(B, t, C, dtype=torch.float16),)), _RMS),
    Spelling("meta-llama-rms-norm-float16", "norm", "meta-llama/llama RMSNorm: _norm(x.float()).type_as(x) * w",
             lambda t: (_half(_module(MetaLlamaRMSNorm, C)), (_randn(B, t, C, dtype=torch.float16),)), _RMS),
    Spelling("rms-weight-float-bfloat16", "norm", "(x.float() normed * w.float()).to(x.dtype), bfloat16",
             lambda t: (_rms_weight_float, (_randn(B, t, C, dtype=torch.bfloat16),
                                            _wb()[0].to(torch.bfloat16))), _RMS),
]


# ---- gelu ---------------------------------------------------------------------------------------
def _gelu_erf(x):
    """transformers activations GELUActivation (python) / BERT's original gelu."""
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _gelu_new(input):
    """transformers NewGELUActivation (GPT-2's gelu_new), minGPT/nanoGPT-era NewGELU."""
    return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


def _gelu_fast(input):
    """transformers FastGELUActivation."""
    return 0.5 * input * (1.0 + torch.tanh(input * 0.7978845608 * (1.0 + 0.044715 * input * input)))


def _bias_gelu(bias, y):
    """NVIDIA Megatron-LM fused_bias_gelu.bias_gelu (eager)."""
    x = bias + y
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def _quick_gelu(input):
    """transformers QuickGELUActivation (CLIP): x * sigmoid(1.702 x), an approximation."""
    return input * torch.sigmoid(1.702 * input)


def _gelu_erf_const(x):
    return 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))


def _gelu_tanh_cube(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def _linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def _x(t):
    return (_randn(B, t, C, scale=2.0),)


_GELU = ("gelu", "linear_act")
_GELUS = [
    Spelling("f-gelu", "gelu", "F.gelu", lambda t: (F.gelu, _x(t)), _GELU),
    Spelling("f-gelu-tanh", "gelu", "F.gelu(approximate='tanh')",
             lambda t: (lambda x: F.gelu(x, approximate="tanh"), _x(t)), _GELU),
    Spelling("nn-gelu", "gelu", "nn.GELU", lambda t: (_module(nn.GELU), _x(t)), _GELU),
    Spelling("erf-form", "gelu", "transformers GELUActivation / BERT gelu",
             lambda t: (_gelu_erf, _x(t)), _GELU),
    Spelling("erf-times-constant", "gelu", "0.5 x (1 + erf(x * 0.7071...))",
             lambda t: (_gelu_erf_const, _x(t)), _GELU),
    Spelling("gpt2-gelu-new", "gelu", "transformers NewGELUActivation (GPT-2, minGPT)",
             lambda t: (_gelu_new, _x(t)), _GELU),
    Spelling("tanh-cube-by-products", "gelu", "tanh form with x * x * x",
             lambda t: (_gelu_tanh_cube, _x(t)), _GELU),
    Spelling("fast-gelu", "gelu", "transformers FastGELUActivation",
             lambda t: (_gelu_fast, _x(t)), _GELU),
    Spelling("megatron-bias-gelu", "gelu", "Megatron-LM bias_gelu",
             lambda t: (_bias_gelu, (0.1 * _randn(C, seed=6), *_x(t))), _GELU),
    Spelling("quick-gelu-sigmoid", "gelu", "transformers QuickGELUActivation (CLIP): no gelu, a swish",
             lambda t: (_quick_gelu, _x(t)), ("swish",)),
    Spelling("linear-then-gelu", "gelu", "F.gelu(F.linear(x, w, b))",
             lambda t: (_linear_gelu, (*_x(t), 0.1 * _randn(C, C, seed=7), 0.1 * _randn(C, seed=8))),
             _GELU),
]

# ---- gated MLPs, cross-entropy, rotary embedding -------------------------------------------------
class LlamaMLP(nn.Module):
    """transformers models/llama LlamaMLP: down(silu(gate(x)) * up(x)), SwiGLU."""

    def __init__(self, act=F.silu):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(C, 2 * C, bias=False), nn.Linear(C, 2 * C, bias=False)
        self.down_proj, self.act_fn = nn.Linear(2 * C, C, bias=False), act

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _swiglu_chunk(x, w):
    """SwiGLU on one fused projection, halves by chunk (x-transformers, FLAN-T5 style GLU)."""
    a, b = (x @ w).chunk(2, dim=-1)
    return a * torch.sigmoid(a) * b


def _geglu(x, w):
    """GeGLU (Shazeer 2020; x-transformers GEGLU): gelu(a) * b."""
    a, b = (x @ w).chunk(2, dim=-1)
    return F.gelu(a) * b


def _ce_functional(logits, targets):
    return F.cross_entropy(logits, targets)


def _ce_nll(logits, targets):
    """nll_loss of log_softmax (minGPT-era classifiers, torchvision references)."""
    return F.nll_loss(F.log_softmax(logits, dim=-1), targets)


def _ce_gather(logits, targets):
    """-log(softmax).gather: the unstable spelling, whose stable core is log_softmax."""
    p = torch.softmax(logits, dim=-1)
    return -torch.log(p).gather(-1, targets[:, None]).mean()


def _rotate_half(x):
    """transformers models/llama rotate_half."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _rotary(q, cos, sin):
    """transformers apply_rotary_pos_emb (one of q, k): q * cos + rotate_half(q) * sin."""
    return (q * cos) + (_rotate_half(q) * sin)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers models/llama apply_rotary_pos_emb: (B, T, D) tables unsqueezed to the heads."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (_rotate_half(q) * sin)
    k_embed = (k * cos) + (_rotate_half(k) * sin)
    return q_embed, k_embed


def _neox_partial_rotary(query, key, cos, sin):
    """transformers models/gpt_neox GPTNeoXAttention: rotary over the first rotary_ndims of each
    head (rotary_pct), the rest passed through, then concatenated back."""
    rotary_ndims = cos.shape[-1]
    query_rot, query_pass = query[..., :rotary_ndims], query[..., rotary_ndims:]
    key_rot, key_pass = key[..., :rotary_ndims], key[..., rotary_ndims:]
    query, key = apply_rotary_pos_emb(query_rot, key_rot, cos, sin)
    return torch.cat((query, query_pass), dim=-1), torch.cat((key, key_pass), dim=-1)


def _rope_tables(t, dim=D, batch=None):
    """cos, sin of LLaMA's rotary embedding (duplicated halves); (B, T, dim) as transformers'
    rotary modules return them when ``batch`` is given."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(t).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    tables = emb.cos(), emb.sin()
    return tables if batch is None else tuple(x.expand(batch, t, dim).contiguous() for x in tables)


def _logits(t):
    return _randn(B * t, 2 * C, seed=9, scale=3.0), torch.randint(0, 2 * C, (B * t,), generator=_gen(10))


def _ce_nanogpt(logits, targets):
    """karpathy/nanoGPT GPT.forward: (B, T, V) logits flattened, -1 targets ignored."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def _ce_log_softmax_gather_sum(logits, targets):
    """The summed negative log-likelihood from log_softmax, targets by unsqueeze."""
    return -F.log_softmax(logits, dim=-1).gather(1, targets.unsqueeze(1)).sum()


def _sequence_logits(t):
    targets = torch.randint(0, 2 * C, (B, t), generator=_gen(10))
    targets[:, -1] = -1  # nanoGPT: positions without a target
    return _randn(B, t, 2 * C, seed=9, scale=3.0), targets


_OTHERS = [
    Spelling("llama-mlp-swiglu", "mlp", "transformers LlamaMLP: silu(gate(x)) * up(x)",
             lambda t: (_module(LlamaMLP), (_randn(B, t, C),)), ("silu",)),
    Spelling("swiglu-chunk", "mlp", "SwiGLU on one projection, a * sigmoid(a) * b",
             lambda t: (_swiglu_chunk, (_randn(B, t, C), 0.1 * _randn(C, 4 * C, seed=11))), ("silu",)),
    Spelling("geglu-chunk", "mlp", "GeGLU: gelu(a) * b", lambda t: (_geglu, (_randn(B, t, C),
             0.1 * _randn(C, 4 * C, seed=11))), ("geglu",)),
    Spelling("cross-entropy-functional", "loss", "F.cross_entropy",
             lambda t: (_ce_functional, _logits(t)), ("cross_entropy",)),
    Spelling("cross-entropy-nll", "loss", "F.nll_loss(F.log_softmax(x))",
             lambda t: (_ce_nll, _logits(t)), ("cross_entropy",)),
    Spelling("cross-entropy-gather", "loss", "-log(softmax(x)).gather(target).mean()",
             lambda t: (_ce_gather, _logits(t)), ("cross_entropy",)),
    Spelling("cross-entropy-nanogpt", "loss", "nanoGPT: F.cross_entropy(logits.view(-1, V), "
             "targets.view(-1), ignore_index=-1)", lambda t: (_ce_nanogpt, _sequence_logits(t)),
             ("cross_entropy",)),
    Spelling("cross-entropy-log-softmax-gather-sum", "loss", "-log_softmax(x).gather(1, t.unsqueeze(1)).sum()",
             lambda t: (_ce_log_softmax_gather_sum, _logits(t)), ("cross_entropy",)),
    Spelling("gemma-mlp-geglu", "mlp", "transformers GemmaMLP: gelu_pytorch_tanh(gate(x)) * up(x)",
             lambda t: (_module(LlamaMLP, lambda x: F.gelu(x, approximate="tanh")), (_randn(B, t, C),)),
             ("geglu",)),
    Spelling("rotary-rotate-half", "rotary", "transformers llama apply_rotary_pos_emb (rotate_half)",
             lambda t: (_rotary, (_randn(B, H, t, D), *_rope_tables(t))), ("rotary",)),
    Spelling("llama-apply-rotary-pos-emb", "rotary", "transformers llama apply_rotary_pos_emb(q, k, "
             "cos, sin): (B, T, D) tables unsqueezed", lambda t: (apply_rotary_pos_emb, (
                 *_qkv(t)[:2], *_rope_tables(t, batch=B))), ("rotary",)),
    Spelling("neox-partial-rotary", "rotary", "transformers GPT-NeoX: rotary over rotary_pct = 0.5 "
             "of each head, the rest passed", lambda t: (_neox_partial_rotary, (
                 *_qkv(t)[:2], *_rope_tables(t, D // 2, batch=B))), ("rotary",)),
]

from spellings_sourced import SOURCED  # noqa: E402  (built from this module's helpers above)

SUITE: dict[str, Spelling] = {s.name: s for s in _ATTENTION + _NORM + _GELUS + _OTHERS + SOURCED}
FAMILIES = ("attention", "norm", "gelu", "mlp", "loss", "rotary")
