"""``activation(x @ weight.T + bias)``: a tiled matmul whose epilogue adds the bias and applies the activation in
registers, so the pre-activation never goes to memory. ``weight`` is in ``nn.Linear`` layout (out, in), read
transposed through its strides. Products accumulate in float32; float32 operands multiply in TF32 only where torch's
own matmuls may."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import mathlib
from .layout import dot_precision, dot_tile, widen_dot
from .runtime import implements, tuned

ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh")
#: tile caps, warps and stages, the default first
CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
           for m, n, k, w, s in ((64, 64, 32, 4, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 128, 64, 8, 3))]


@triton.jit
def _linear_act_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, HAS_BIAS: tl.constexpr,
                       ACTIVATION: tl.constexpr, WIDEN: tl.constexpr, PRECISION: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start_k in tl.range(0, K, BLOCK_K):
        ks = start_k + offs_k
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * K + ks[None, :],
                    mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0)
        w_t = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * K + ks[:, None],
                      mask=(offs_n[None, :] < N) & (ks[:, None] < K), other=0.0)
        if WIDEN:
            x, w_t = x.to(tl.float32), w_t.to(tl.float32)
        acc = tl.dot(x, w_t, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    y = mathlib.activate(acc, ACTIVATION)
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :],
             y.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@implements("linear_act", configs=CONFIGS)
def linear_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               activation: str, *, config: dict | None = None) -> torch.Tensor:
    """``act(F.linear(x, weight, bias))``, ``activation`` of :data:`ACTIVATIONS` ('gelu': erf; 'gelu_tanh': tanh)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear_act: unknown activation {activation!r}; expected one of {ACTIVATIONS}")
    N, K = weight.shape
    x2 = x.contiguous().reshape(-1, K)
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if out.numel():
        c = tuned(config, CONFIGS, dot_tile, BLOCK_M=M, BLOCK_N=N, BLOCK_K=K)
        _linear_act_kernel[(triton.cdiv(M, c["BLOCK_M"]), triton.cdiv(N, c["BLOCK_N"]))](
            x2, weight.contiguous(), x2 if bias is None else bias.contiguous(), out, M, N, K,
            HAS_BIAS=bias is not None, ACTIVATION=activation, WIDEN=widen_dot(x.dtype),
            PRECISION=dot_precision(x.dtype), **c)
    return out.reshape(*x.shape[:-1], N)
