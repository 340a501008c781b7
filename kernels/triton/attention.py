"""Scaled dot-product attention, FlashAttention style: ``softmax(q k^T * scale) v`` in tiles, with an optional mask
read tile by tile: an additive bias (``sdpa_masked``: -inf masks a key outright) or a boolean keep-mask whose dropped
keys score ``fill`` (``sdpa_filled``).

A program owns BLOCK_M queries of one batch entry and walks the keys in tiles of BLOCK_N, keeping per query a
running max, a running sum of exponentials and an unnormalized output that are rescaled when the max grows:
the (L, S) score matrix is never formed. Head dims are padded to powers of two with masked loads. The causal
mask is torch's (top-left aligned: query i sees keys j <= i); a causal program stops at its last visible key
tile. Scores are float32, their exponentials exp2 of (s - max) log2(e); float32 products in TF32 only where
torch's matmuls may. The extremes are the definition's, in the kernel rather than by a guard on the host: a
row whose every key is masked by -inf is 0/0 = NaN, a +inf or NaN score makes its row NaN, a finite ``fill``
everywhere averages v, and a tile of masked keys before the first visible one adds nothing."""
from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl

from egraph_opt.lang import ops
from .layout import dot_precision, dot_tile, widen_dot
from .runtime import implements, tuned

LOG2E = tl.constexpr(1.4426950408889634)  # a global that a kernel reads must be a constexpr
#: query and key tile caps, warps and stages, the default first
CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
           for m, n, w, s in ((64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 4), (128, 32, 8, 2))]


def _head_dim(use) -> str | None:
    if any(len(shape) < 2 for shape in use.shapes):
        return "q, k and v must be at least matrices"
    e = use.shapes[0][-1]
    return None if 16 <= e <= 128 else f"head dim {e} outside 16..128"


NO_MASK, BIAS, KEEP = 0, 1, 2


@triton.jit
def _masked(scores, mask_ptr, offs_m, offs_n, L, S, fill, mask_l, mask_s, CAUSAL: tl.constexpr, MASK: tl.constexpr):
    """Scores with the bias added or the kept mask applied, -inf where a key is out of range or (causal) future."""
    inside = (offs_m[:, None] < L) & (offs_n[None, :] < S)
    if MASK == 1:
        bias = tl.load(mask_ptr + offs_m[:, None] * mask_l + offs_n[None, :] * mask_s,
                       mask=inside, other=0.0).to(tl.float32)
        scores = tl.where(bias == float("-inf"), float("-inf"), scores + bias)
    if MASK == 2:
        keep = tl.load(mask_ptr + offs_m[:, None] * mask_l + offs_n[None, :] * mask_s, mask=inside, other=0)
        scores = tl.where(keep != 0, scores, fill)
    visible = offs_n[None, :] < S
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= offs_m[:, None])
    return tl.where(visible, scores, float("-inf"))


@triton.jit
def _sdpa_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, L, S, E, EV, scale, fill, group,
                 mask_b, mask_l, mask_s, CAUSAL: tl.constexpr, MASK: tl.constexpr,
                 WIDEN: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, E_P: tl.constexpr, EV_P: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    batch = tl.program_id(1).to(tl.int64)
    q_ptr += batch * L * E
    k_ptr += batch // group * S * E  # grouped-query: q's head h reads k's and v's h // group
    v_ptr += batch // group * S * EV
    out_ptr += batch * L * EV
    mask_ptr += batch * mask_b
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, E_P)
    offs_ev = tl.arange(0, EV_P)
    q = tl.load(q_ptr + offs_m[:, None] * E + offs_e[None, :],
                mask=(offs_m[:, None] < L) & (offs_e[None, :] < E), other=0.0)
    if WIDEN:
        q = q.to(tl.float32)
    m_i = tl.zeros([BLOCK_M], tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, EV_P], tl.float32)
    end_n = tl.minimum(S, start_m + BLOCK_M) if CAUSAL else S
    for start_n in tl.range(0, end_n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_t = tl.load(k_ptr + offs_n[None, :] * E + offs_e[:, None],
                      mask=(offs_n[None, :] < S) & (offs_e[:, None] < E), other=0.0)
        if WIDEN:
            k_t = k_t.to(tl.float32)
        scores = _masked(tl.dot(q, k_t, input_precision=PRECISION) * scale, mask_ptr, offs_m, offs_n,
                         L, S, fill, mask_l, mask_s, CAUSAL, MASK)
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no -inf - -inf while all masked
        p = tl.exp2((scores - m_safe[:, None]) * LOG2E)
        alpha = tl.exp2((m_i - m_safe) * LOG2E)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + offs_n[:, None] * EV + offs_ev[None, :],
                    mask=(offs_n[:, None] < S) & (offs_ev[None, :] < EV), other=0.0)
        if WIDEN:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + offs_m[:, None] * EV + offs_ev[None, :], out.to(out_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < L) & (offs_ev[None, :] < EV))


def _attend(q, k, v, scale, causal, config, mask=None, mode=NO_MASK, fill=0.0):
    """Attention of q (..., L, E), k (..., S, E), v (..., S, Ev) and a mask broadcasting to
    (..., L, S); batch dims broadcast, k and v of fewer heads (``ops.groups``) read in place."""
    L, E = q.shape[-2:]
    S, EV = v.shape[-2:]
    group = ops.groups(q, k)
    if ops.groups(q, v) != group:  # one reading of heads for both: repeated
        k, v, group = ops.grouped(q, k), ops.grouped(q, v), 1
    shapes = [q.shape[:-2]] + [t.shape[:-3] + (q.shape[-3],) if group > 1 else t.shape[:-2] for t in (k, v)]
    batch = torch.broadcast_shapes(*shapes, *([mask.shape[:-2]] if mask is not None else []))
    kv = batch if group == 1 else (*batch[:-1], batch[-1] // group)
    q3, k3, v3 = (t.expand(*b, *t.shape[-2:]).reshape(-1, *t.shape[-2:]).contiguous()
                  for t, b in ((q, batch), (k, kv), (v, kv)))
    m3 = q3 if mask is None else mask.expand(*batch, L, S).reshape(-1, L, S)  # a view where it can
    out = torch.empty((q3.shape[0], L, EV), dtype=q.dtype, device=q.device)
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    c = tuned(config, CONFIGS, dot_tile, BLOCK_M=L, BLOCK_N=S)
    if out.numel():
        grid = (triton.cdiv(L, c["BLOCK_M"]), q3.shape[0])
        _sdpa_kernel[grid](q3, k3, v3, m3, out, L, S, E, EV, scale, fill, group, *m3.stride(),
                           CAUSAL=bool(causal), MASK=mode, WIDEN=widen_dot(q.dtype), PRECISION=dot_precision(q.dtype),
                           E_P=dot_tile(E), EV_P=dot_tile(EV), **c)
    return out.reshape(*batch, L, EV)


@implements("sdpa", limits=_head_dim, configs=CONFIGS)
def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None,
         causal: bool, *, config: dict | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)``."""
    return _attend(q, k, v, scale, causal, config)


@implements("sdpa_masked", limits=_head_dim, dtypes=("bool",), configs=CONFIGS)
def sdpa_masked(q, k, v, bias, scale, *, config=None) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v (``ops.sdpa_masked``); a boolean bias adds 1 where True."""
    return _attend(q, k, v, scale, False, config, bias, BIAS)


@implements("sdpa_filled", limits=_head_dim, dtypes=("bool",), configs=CONFIGS)
def sdpa_filled(q, k, v, keep, scale, fill, *, config=None) -> torch.Tensor:
    """softmax(where(keep, q k^T * scale, fill)) v (``ops.sdpa_filled``), fill as float32 has it."""
    with np.errstate(over="ignore"):  # beyond float32: -inf, as a float32 tensor would hold it
        fill = float(np.float32(fill))
    return _attend(q, k, v, scale, False, config, keep, KEEP, fill)
