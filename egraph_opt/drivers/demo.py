"""The demo: a naive attention, traced on moderate inputs, comes back fused and stable.

Run with ``python -m egraph_opt.drivers.demo``. At large scores the naive program overflows exp() and
returns NaN in float16 and float32; the optimized program stays within rounding of float64."""
from __future__ import annotations

import math

import torch

from egraph_opt import saturate_and_extract


def naive_attention(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True)
    return weights @ v


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).abs().max() / ref.abs().max())


def main() -> int:
    torch.manual_seed(0)
    attention = saturate_and_extract(naive_attention)
    shape = (2, 4, 64, 32)  # batch, heads, tokens, head dim
    failures = 0
    for dtype in (torch.float32, torch.float16):
        q, k, v = (torch.randn(shape, dtype=dtype) for _ in range(3))
        attention(q, k, v)  # first call: trace on moderate inputs, optimize, validate
        print(attention.report, end="\n\n")
        for scale in (1.0, 8.0):  # scores of a few units, then of hundreds
            qs, ks = q * scale, k * scale
            scores = qs.double() @ ks.double().transpose(-2, -1) / math.sqrt(shape[-1])
            reference = torch.softmax(scores, -1) @ v.double()
            naive, optimized = naive_attention(qs, ks, v), attention(qs, ks, v)
            bad, err = (~torch.isfinite(naive)).float().mean().item(), relative_error(optimized, reference)
            naive_err = relative_error(naive, reference) if bad == 0 else math.inf
            failures += not (err < (1e-2 if dtype == torch.float16 else 1e-4))
            print(f"{str(dtype):>14} max |score| {float(scores.abs().max()):6.0f}: "
                  f"naive non-finite {bad:6.1%}, error {naive_err:.2e} | "
                  f"optimized non-finite {(~torch.isfinite(optimized)).float().mean().item():.1%}, error {err:.2e}")
        print()
    print("optimized program matches float64 everywhere" if not failures
          else f"{failures} optimized runs exceeded tolerance")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
