"""Scaled dot-product attention, FlashAttention style: ``softmax(q k^T * scale) v`` in tiles.

A program owns BLOCK_M queries of one batch entry and walks the keys in tiles of BLOCK_N,
keeping per query a running max, a running sum of exponentials and an unnormalized output that
are rescaled when the max grows: the (L, S) score matrix is never formed. Head dims are padded to
powers of two with masked loads. The causal mask is torch's (top-left aligned: query i sees keys
j <= i); a causal program stops at its last visible key tile. Scores use exp2 with log2(e) folded
into the scale; float32 products are exact ("ieee"), not TF32.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .layout import dot_tile
from .runtime import implements

LOG2E = 1.4426950408889634
BLOCK_M = 64
BLOCK_N = 64


def _head_dim(use) -> str | None:
    if any(len(shape) < 2 for shape in use.shapes):
        return "q, k and v must be at least matrices"
    e = use.shapes[0][-1]
    return None if 16 <= e <= 128 else f"head dim {e} outside 16..128"


@triton.jit
def _sdpa_kernel(q_ptr, k_ptr, v_ptr, out_ptr, L, S, E, EV, qk_scale, CAUSAL: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 E_P: tl.constexpr, EV_P: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    batch = tl.program_id(1).to(tl.int64)
    q_ptr += batch * L * E
    k_ptr += batch * S * E
    v_ptr += batch * S * EV
    out_ptr += batch * L * EV
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, E_P)
    offs_ev = tl.arange(0, EV_P)
    q = tl.load(q_ptr + offs_m[:, None] * E + offs_e[None, :],
                mask=(offs_m[:, None] < L) & (offs_e[None, :] < E), other=0.0)
    m_i = tl.zeros([BLOCK_M], tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, EV_P], tl.float32)
    end_n = tl.minimum(S, start_m + BLOCK_M) if CAUSAL else S
    for start_n in tl.range(0, end_n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_t = tl.load(k_ptr + offs_n[None, :] * E + offs_e[:, None],
                      mask=(offs_n[None, :] < S) & (offs_e[:, None] < E), other=0.0)
        scores = tl.dot(q, k_t, input_precision="ieee") * qk_scale
        visible = offs_n[None, :] < S
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))  # finite: key 0 is visible to every query
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + offs_n[:, None] * EV + offs_ev[None, :],
                    mask=(offs_n[:, None] < S) & (offs_ev[None, :] < EV), other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + offs_m[:, None] * EV + offs_ev[None, :], out.to(out_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < L) & (offs_ev[None, :] < EV))


@implements("sdpa", limits=_head_dim)
def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None,
         causal: bool) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)`` for q (..., L, E),
    k (..., S, E), v (..., S, Ev); batch dims broadcast."""
    L, E = q.shape[-2:]
    S, EV = v.shape[-2:]
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q3, k3, v3 = (t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:]).contiguous()
                  for t in (q, k, v))
    out = torch.empty((q3.shape[0], L, EV), dtype=q.dtype, device=q.device)
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    block_m = dot_tile(L, BLOCK_M)
    if out.numel():
        grid = (triton.cdiv(L, block_m), q3.shape[0])
        _sdpa_kernel[grid](q3, k3, v3, out, L, S, E, EV, scale * LOG2E, CAUSAL=bool(causal),
                           BLOCK_M=block_m, BLOCK_N=dot_tile(S, BLOCK_N),
                           E_P=dot_tile(E), EV_P=dot_tile(EV))
    return out.reshape(*batch, L, EV)

