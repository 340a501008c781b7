"""Spellings read in other projects' sources (issue 32 item 6), each entry's ``source`` naming the
file: the op graphs ONNX Runtime's transformer fusions match (microsoft/onnxruntime
onnxruntime/python/tools/transformers/fusion_*.py), xformers' reference attentions, and the eager
attention of model families the first half of the suite lacks (GPT-NeoX, BLOOM, Falcon, OPT,
Whisper, ViT, CLIP, DistilBERT, Phi, MPT). Only the few lines of math are transcribed; weights are
random, built in code. ``spellings.SUITE`` holds these entries beside its own (import ``spellings``
first: it imports this module once its helpers exist).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from spellings import (_GELU, _LN, _MASKED, _SDPA, B, C, D, H, Spelling, _additive_causal, _causal_bool,
                       _module, _qkv, _randn, _wb, _x)

ORT = "microsoft/onnxruntime onnxruntime/python/tools/transformers/"
HF = "huggingface/transformers src/transformers/models/"


# ---- ONNX Runtime: the subgraphs its fusions match, written as the torch that exports to them ----
def ort_layer_norm(x, w, b):
    """fusion_layernorm.py FusionLayerNormalization: ReduceMean, Sub (shared), Pow(2), ReduceMean,
    Add(eps), Sqrt, Div, Mul(weight), Add(bias)."""
    d = x - x.mean(-1, keepdim=True)
    return d / torch.sqrt(d.pow(2).mean(-1, keepdim=True) + 1e-12) * w + b


def ort_layer_norm_tf(x, w, b):
    """fusion_layernorm.py FusionLayerNormalizationTF (keras2onnx / tf2onnx): the variance of a
    Mul(d, d), Reciprocal(Sqrt), the weight folded into the scale, the bias as b - mean * scale."""
    mean = x.mean(-1, keepdim=True)
    d = x - mean
    scale = torch.reciprocal(torch.sqrt((d * d).mean(-1, keepdim=True) + 1e-5)) * w
    return x * scale + (b - mean * scale)


def ort_skip_layer_norm(x, skip, w, b):
    """fusion_skiplayernorm.py FusionSkipLayerNormalization: Add(input, skip), then the layer norm
    graph fusion_layernorm.py matches."""
    return ort_layer_norm(x + skip, w, b)


def ort_bias_skip_layer_norm(x, skip, weight, bias, w, b):
    """fusion_skiplayernorm.py FusionBiasSkipLayerNormalization: MatMul, Add(bias), Add(skip),
    layer norm."""
    return ort_layer_norm(x @ weight + bias + skip, w, b)


def ort_gelu_tf(x):
    """fusion_gelu.py fuse_3 (TensorFlow): Mul(0.7071067690849304, float32's 1/sqrt(2)), Erf,
    Add(1), Mul(0.5), Mul(root)."""
    return x * (0.5 * (1.0 + torch.erf(x * 0.7071067690849304)))


def ort_gelu_sqrt_node(x):
    """fusion_gelu.py fuse_2 (Keras): Div by a Sqrt(2.0) node, Erf, Add(1), Mul(0.5), Mul(root)."""
    return x * ((1.0 + torch.erf(x / torch.sqrt(torch.tensor(2.0)))) * 0.5)


def ort_fast_gelu(x):
    """fusion_fastgelu.py fuse_4 (torch's tanh gelu as exported): Mul(x, x), Mul(x), Mul(0.0447...),
    Add(x), Mul(0.7978...), Tanh, Add(1), Mul(x), Mul(0.5), constants rounded to float32."""
    inner = 0.7978845834732056 * (x + 0.044714998453855515 * (x * x * x))
    return x * (1.0 + torch.tanh(inner)) * 0.5


def ort_bias_gelu(x, weight, bias):
    """fusion_biasgelu.py FusionBiasGelu: MatMul, Add(1-D bias), then the Gelu of fusion_gelu.py's
    pattern 1 (Div(1.4142), Erf, Add(1), Mul, Mul(0.5))."""
    y = x @ weight + bias
    return (y * 0.5) * (1.0 + torch.erf(y / 1.4142135623730951))


class OrtBertAttention(nn.Module):
    """fusion_attention.py FusionAttention path1: MatMul+Add per projection, Reshape, Transpose
    (K by perm (0, 2, 3, 1)), MatMul, Div(sqrt d), Add(mask), Softmax, MatMul, Transpose, Reshape;
    the mask from a 2-D one by Unsqueeze, Unsqueeze, Cast, Sub(1, .), Mul(-10000)."""

    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)

    def forward(self, x, mask):
        b, t, _ = x.shape
        q = self.query(x).reshape(b, t, H, D).transpose(1, 2)
        k = self.key(x).reshape(b, t, H, D).permute(0, 2, 3, 1)
        v = self.value(x).reshape(b, t, H, D).transpose(1, 2)
        bias = (1.0 - mask[:, None, None, :].float()) * -10000.0
        probs = torch.softmax(q @ k / math.sqrt(D) + bias, dim=-1)
        return (probs @ v).transpose(1, 2).reshape(b, t, C)


def ort_sdpa_export(q, k, v, mask):
    """fusion_attention.py qk path "sdpa" (torch's scaled_dot_product_attention as exported):
    Mul(q, sqrt(scale)) and Mul(k^T, sqrt(scale)), MatMul, Add(mask), Softmax, MatMul; the mask
    Where(Cast(Sub(1, Expand(Unsqueeze(Unsqueeze(mask))))), finfo.min)."""
    inverted = 1.0 - mask[:, None, None, :].expand(B, 1, q.size(-2), k.size(-2)).float()
    bias = inverted.masked_fill(inverted.bool(), torch.finfo(q.dtype).min)
    root = math.sqrt(1.0 / math.sqrt(q.size(-1)))
    return torch.softmax((q * root) @ (k.transpose(-2, -1) * root) + bias, dim=-1) @ v


# ---- xformers --------------------------------------------------------------------------------------
def xformers_ref_attention(q, k, v, attn_bias):
    """facebookresearch/xformers xformers/benchmarks/benchmark_mem_eff_attention.py ref_attention:
    (B*H, M, K) tensors, the bias added by baddbmm."""
    q = q * (1.0 / q.shape[-1] ** 0.5)
    return torch.baddbmm(attn_bias, q, k.transpose(-2, -1)).softmax(-1) @ v


def xformers_core_bool(q, k, v, mask):
    """facebookresearch/xformers xformers/components/attention/core.py scaled_dot_product_attention
    (dense path): q / sqrt(d), a 2-D boolean mask broadcast over the batch, att[~mask] = -inf."""
    q = q / math.sqrt(k.size(-1))
    att = q @ k.transpose(-2, -1)
    att[~mask.unsqueeze(0).expand(att.shape[0], -1, -1)] = float("-inf")
    return torch.softmax(att, dim=att.ndim - 1) @ v


def xformers_core_additive(q, k, v, mask):
    """The same with an additive float mask: att += mask."""
    att = (q / math.sqrt(k.size(-1))) @ k.transpose(-2, -1)
    att += mask
    return torch.softmax(att, dim=att.ndim - 1) @ v


def _flat(t):
    """q, k, v as (B*H, T, D), the layout xformers' references take."""
    return tuple(x.reshape(B * H, t, D) for x in _qkv(t))


# ---- model families -----------------------------------------------------------------------------
def gpt_neox_attn(query, key, value, causal, attention_mask):
    """GPTNeoXAttention._attn: scores by baddbmm into zeros (alpha = head_size^-0.5), the causal
    buffer by where with a tensor finfo.min, then the additive mask."""
    b, h, t, d = query.shape
    scores = torch.zeros(b * h, t, t, dtype=query.dtype)
    scores = torch.baddbmm(scores, query.view(b * h, t, d), key.view(b * h, t, d).transpose(1, 2),
                           beta=1.0, alpha=d ** -0.5).view(b, h, t, t)
    scores = torch.where(causal[:, :, :t, :t], scores, torch.tensor(torch.finfo(scores.dtype).min))
    return torch.matmul(F.softmax(scores + attention_mask, dim=-1).to(value.dtype), value)


def _alibi(t, heads=H):
    """BLOOM's build_alibi_tensor for an all-ones mask: slopes 2^(-8k/H) times key positions,
    (B*H, 1, T)."""
    slopes = torch.pow(torch.tensor(2 ** (-(2 ** -(math.log2(heads) - 3)))), torch.arange(1, 1 + heads))
    positions = torch.arange(t).float()[None, None, :]
    return (slopes[None, :, None] * positions).expand(B, heads, t).reshape(B * heads, 1, t)


class BloomAttention(nn.Module):
    """BloomAttention (layer 2: beta = 1/2, alpha = 1/(2 sqrt d), undone by * layer_number): fused
    qkv split per head, baddbmm onto alibi, scores in float32, masked_fill(finfo(float32).min),
    softmax(dtype=float32), bmm, heads merged."""

    def __init__(self, layer_number=2):
        super().__init__()
        self.query_key_value, self.dense = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.layer_number = layer_number
        self.inv_norm_factor, self.beta = 1.0 / (math.sqrt(D) * layer_number), 1.0 / layer_number

    def forward(self, x, alibi, mask):
        b, t, _ = x.shape
        q, k, v = self.query_key_value(x).reshape(b, t, H, 3 * D).split(D, dim=-1)
        scores = torch.baddbmm(alibi, q.transpose(1, 2).reshape(b * H, t, D),
                               k.permute(0, 2, 3, 1).reshape(b * H, D, t),
                               beta=self.beta, alpha=self.inv_norm_factor).view(b, H, t, t)
        weights = torch.masked_fill(scores.float() * self.layer_number, mask, torch.finfo(torch.float32).min)
        probs = F.softmax(weights, dim=-1, dtype=torch.float32).to(x.dtype).view(b * H, t, t)
        context = torch.bmm(probs, v.transpose(1, 2).reshape(b * H, t, D))
        return self.dense(context.view(b, H, t, D).permute(0, 2, 1, 3).reshape(b, t, C))


def falcon_eager(query, key, value, attention_mask):
    """FalconAttention (rotary, no sdpa): scores /= sqrt(d) in place, softmax of scores + mask with
    dtype=hidden_states.dtype."""
    scores = query @ key.transpose(-1, -2)
    scores /= math.sqrt(query.size(-1))
    return F.softmax(scores + attention_mask, dim=-1, dtype=query.dtype) @ value


def falcon_alibi(query, key, value, alibi, attention_mask):
    """FalconAttention (alibi branch): alibi added to the raw scores, then *= inv_norm_factor in
    place, softmax of logits + mask, (probs @ v).flatten(0, 1)."""
    b, h, t, d = query.shape
    logits = (query @ key.transpose(-1, -2)).view(b, h, t, t) + alibi.view(b, h, 1, -1)
    logits *= 1.0 / math.sqrt(d)
    probs = F.softmax(logits + attention_mask, dim=-1, dtype=query.dtype)
    return (probs.view(b, h, t, t) @ value).flatten(0, 1)


class BartStyleAttention(nn.Module):
    """The BartAttention copies (OPT, Whisper, CLIP): q_proj(x) * scaling, heads by view +
    transpose + contiguous, bmm over (B*H, T, D); ``clamp`` adds OPT's torch.max(w, finfo.min)."""

    def __init__(self, k_bias=True, clamp=False):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(C, C), nn.Linear(C, C, bias=k_bias)
        self.v_proj, self.out_proj = nn.Linear(C, C), nn.Linear(C, C)
        self.scaling, self.clamp = D ** -0.5, clamp

    def _shape(self, x, t, b):
        return x.view(b, t, H, D).transpose(1, 2).contiguous()

    def forward(self, x, mask, padding=None):
        b, t, _ = x.shape
        proj = (b * H, -1, D)
        q = self._shape(self.q_proj(x) * self.scaling, t, b).view(*proj)
        k, v = (self._shape(p(x), -1, b).view(*proj) for p in (self.k_proj, self.v_proj))
        w = torch.bmm(q, k.transpose(1, 2))
        for m in (mask, padding)[:1 + (padding is not None)]:  # CLIP: causal, then padding
            w = w.view(b, H, t, t) + m
            if self.clamp:
                w = torch.max(w, torch.tensor(torch.finfo(w.dtype).min))
            w = w.view(b * H, t, t)
        out = torch.bmm(F.softmax(w, dim=-1), v).view(b, H, t, D).transpose(1, 2)
        return self.out_proj(out.reshape(b, t, C))


class ViTSelfAttention(nn.Module):
    """ViTSelfAttention with eager_attention_forward: transpose_for_scores (view + permute),
    matmul * scaling, softmax(dtype=float32).to(dtype), matmul, transpose + contiguous, view."""

    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
        self.scaling = D ** -0.5

    def transpose_for_scores(self, x):
        return x.view(x.size()[:-1] + (H, D)).permute(0, 2, 1, 3)

    def forward(self, x):
        k, v, q = (self.transpose_for_scores(p(x)) for p in (self.key, self.value, self.query))
        w = F.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scaling, dim=-1, dtype=torch.float32)
        context = torch.matmul(w.to(q.dtype), v).transpose(1, 2).contiguous()
        return context.view(context.size()[:-2] + (C,))


class DistilBertAttention(nn.Module):
    """DistilBERT MultiHeadSelfAttention: q / sqrt(d), (mask == 0).view(B, 1, 1, T).expand_as(scores),
    masked_fill with torch.tensor(finfo.min), softmax, matmul, heads merged, out_lin."""

    def __init__(self):
        super().__init__()
        self.q_lin, self.k_lin, self.v_lin = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
        self.out_lin = nn.Linear(C, C)

    def forward(self, x, mask):
        bs, t, _ = x.shape
        q, k, v = (lin(x).view(bs, -1, H, D).transpose(1, 2) for lin in (self.q_lin, self.k_lin, self.v_lin))
        scores = torch.matmul(q / math.sqrt(D), k.transpose(2, 3))
        hidden = (mask == 0).view(bs, 1, 1, t).expand_as(scores)
        weights = F.softmax(scores.masked_fill(hidden, torch.tensor(torch.finfo(scores.dtype).min)), dim=-1)
        return self.out_lin(torch.matmul(weights, v).transpose(1, 2).contiguous().view(bs, -1, C))


def phi_upcast(query, key, value, causal_mask):
    """PhiAttention (v4.4x): q and k upcast to float32 before their product (Phi-2 overflows in
    half), / sqrt(d), attn_weights += causal_mask, softmax(dtype=float32).to(value.dtype)."""
    w = torch.matmul(query.to(torch.float32), key.to(torch.float32).transpose(2, 3)) / math.sqrt(D)
    w += causal_mask
    return torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(value.dtype), value)


def mpt_attention(query, key, value, position_bias, mask):
    """MptAttention: matmul * softmax_scale, + position_bias (alibi), masked_fill(finfo.min),
    softmax of the float32 scores .to(value.dtype)."""
    scores = torch.matmul(query, key.transpose(-1, -2)) * D ** -0.5 + position_bias
    scores = scores.masked_fill(mask, torch.finfo(query.dtype).min)
    return torch.matmul(F.softmax(scores.float(), dim=-1).to(value.dtype), value)


def _ids_mask(t):
    """A (B, T) 0/1 padding mask as tokenizers return it: the last key of the second row padding."""
    mask = torch.ones(B, t, dtype=torch.long)
    mask[1, -1] = 0
    return mask


def _x3(t, dtype=torch.float32):
    return _randn(B, t, C, dtype=dtype)


def _half_qkv(t):
    return _qkv(t, torch.float16)


SOURCED = [
    Spelling("ort-layer-norm", "norm", ORT + "fusion_layernorm.py: FusionLayerNormalization",
             lambda t: (ort_layer_norm, (_x3(t), *_wb())), _LN),
    Spelling("ort-layer-norm-tf", "norm", ORT + "fusion_layernorm.py: FusionLayerNormalizationTF",
             lambda t: (ort_layer_norm_tf, (_x3(t), *_wb())), _LN),
    Spelling("ort-skip-layer-norm", "norm", ORT + "fusion_skiplayernorm.py: FusionSkipLayerNormalization",
             lambda t: (ort_skip_layer_norm, (_x3(t), _randn(B, t, C, seed=6), *_wb())), _LN),
    Spelling("ort-bias-skip-layer-norm", "norm", ORT + "fusion_skiplayernorm.py: "
             "FusionBiasSkipLayerNormalization", lambda t: (ort_bias_skip_layer_norm, (
                 _x3(t), _randn(B, t, C, seed=6), 0.1 * _randn(C, C, seed=7), 0.1 * _randn(C, seed=8), *_wb())),
             _LN),
    Spelling("ort-gelu-erf-tf", "gelu", ORT + "fusion_gelu.py: FusionGelu.fuse_3",
             lambda t: (ort_gelu_tf, _x(t)), _GELU),
    Spelling("ort-gelu-erf-sqrt-node", "gelu", ORT + "fusion_gelu.py: FusionGelu.fuse_2",
             lambda t: (ort_gelu_sqrt_node, _x(t)), _GELU),
    Spelling("ort-fast-gelu", "gelu", ORT + "fusion_fastgelu.py: FusionFastGelu.fuse_4",
             lambda t: (ort_fast_gelu, _x(t)), _GELU),
    Spelling("ort-bias-gelu", "gelu", ORT + "fusion_biasgelu.py: FusionBiasGelu",
             lambda t: (ort_bias_gelu, (*_x(t), 0.1 * _randn(C, C, seed=7), 0.1 * _randn(C, seed=8))), _GELU),
    Spelling("ort-attention-bert", "attention", ORT + "fusion_attention.py: FusionAttention (path1)",
             lambda t: (_module(OrtBertAttention), (_x3(t), _ids_mask(t))), _MASKED),
    Spelling("ort-attention-sdpa-export", "attention", ORT + "fusion_attention.py: FusionAttention "
             "(qk path sdpa)", lambda t: (ort_sdpa_export, (*_qkv(t), _ids_mask(t))), _MASKED),
    Spelling("xformers-ref-attention-baddbmm", "attention", "facebookresearch/xformers "
             "xformers/benchmarks/benchmark_mem_eff_attention.py: ref_attention",
             lambda t: (xformers_ref_attention, (*_flat(t), (3 * _randn(B * H, 1, t, seed=4)).expand(
                 B * H, t, t))), _MASKED),
    Spelling("xformers-core-bool-mask", "attention", "facebookresearch/xformers "
             "xformers/components/attention/core.py: scaled_dot_product_attention (att[~mask] = -inf)",
             lambda t: (xformers_core_bool, (*_flat(t), ~_causal_bool(t))), _MASKED),
    Spelling("xformers-core-additive", "attention", "facebookresearch/xformers "
             "xformers/components/attention/core.py: _matmul_with_mask (att += mask)",
             lambda t: (xformers_core_additive, (*_flat(t), _additive_causal(t)[0])), _MASKED),
    Spelling("gpt-neox-baddbmm", "attention", HF + "gpt_neox/modeling_gpt_neox.py: GPTNeoXAttention._attn",
             lambda t: (gpt_neox_attn, (*_qkv(t), ~_causal_bool(t).view(1, 1, t, t),
                                        torch.zeros(B, 1, 1, t))), (*_MASKED, "sdpa_filled_then_biased")),
    Spelling("bloom-baddbmm-alibi", "attention", HF + "bloom/modeling_bloom.py: BloomAttention",
             lambda t: (_module(BloomAttention), (_x3(t), _alibi(t), _causal_bool(t).view(1, 1, t, t))),
             (*_MASKED, "sdpa_filled_biased")),
    Spelling("falcon-eager", "attention", HF + "falcon/modeling_falcon.py: FalconAttention (rotary, eager)",
             lambda t: (falcon_eager, (*_qkv(t), _additive_causal(t))), _MASKED),
    Spelling("falcon-alibi", "attention", HF + "falcon/modeling_falcon.py: FalconAttention (alibi)",
             lambda t: (falcon_alibi, (*_qkv(t), _alibi(t), _additive_causal(t))), _MASKED),
    Spelling("opt-bmm-clamp", "attention", HF + "opt/modeling_opt.py: OPTAttention (v4.2x bmm path)",
             lambda t: (_module(BartStyleAttention, True, True), (_x3(t), _additive_causal(t))),
             (*_MASKED, "sdpa_floored")),
    Spelling("whisper-decoder-self-attention", "attention", HF + "whisper/modeling_whisper.py: "
             "WhisperAttention (k_proj without bias)",
             lambda t: (_module(BartStyleAttention, False), (_x3(t), _additive_causal(t))), _MASKED),
    Spelling("clip-text-attention", "attention", HF + "clip/modeling_clip.py: CLIPAttention (causal and "
             "padding masks)", lambda t: (_module(BartStyleAttention), (_x3(t), _additive_causal(t), torch.zeros(
                 B, 1, t, t).masked_fill(_ids_mask(t)[:, None, None, :] == 0, torch.finfo(torch.float32).min))),
             _MASKED),
    Spelling("vit-self-attention", "attention", HF + "vit/modeling_vit.py: ViTSelfAttention",
             lambda t: (_module(ViTSelfAttention), (_x3(t),)), _SDPA),
    Spelling("distilbert-attention", "attention", HF + "distilbert/modeling_distilbert.py: "
             "MultiHeadSelfAttention", lambda t: (_module(DistilBertAttention), (_x3(t), _ids_mask(t))),
             _MASKED),
    Spelling("phi-upcast-float16", "attention", HF + "phi/modeling_phi.py: PhiAttention (q, k upcast)",
             lambda t: (phi_upcast, (*_half_qkv(t), torch.zeros(1, 1, t, t, dtype=torch.float16).masked_fill(
                 _causal_bool(t), torch.finfo(torch.float16).min))), _MASKED),
    Spelling("mpt-alibi-masked-fill", "attention", HF + "mpt/modeling_mpt.py: MptAttention",
             lambda t: (mpt_attention, (*_qkv(t), _alibi(t).view(B, H, 1, t)[0], _causal_bool(t))),
             (*_MASKED, "sdpa_filled_biased")),
]
