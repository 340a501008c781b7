"""Stability benchmark: naive programs, traced on moderate inputs, evaluated at extreme inputs.

For each case and dtype (float32, float16): max relative error (scale-normalized, against a
float64 truth computed on the same rounded inputs) and non-finite rate of the naive and of the
optimized program, and the curvature cost before/after. Goal: optimized error within 1e-4 (float32)
and 1e-2 (float16) on every case.

    python bench/stability.py
"""
from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

from egraph_opt import saturate_and_extract

TOL = {torch.float32: 1e-4, torch.float16: 1e-2}
BIG = {torch.float32: 1e6, torch.float16: 1e3}  # offsets that still leave digits to lose
HUGE = {torch.float32: 1e25, torch.float16: 1e3}


def _attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v


def _naive_attention(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.exp(s) / torch.exp(s).sum(-1, keepdim=True) @ v


def _sig(x):
    return 1 / (1 + torch.exp(-x))


def _naive_bce(x, y):
    return -(y * torch.log(_sig(x)) + (1 - y) * torch.log(1 - _sig(x)))


def _bce(x, y):
    return F.binary_cross_entropy_with_logits(x, y, reduction="none")


def _naive_ce(x, y):
    logp = torch.log(torch.exp(x) / torch.exp(x).sum(-1, keepdim=True))
    return -logp.gather(-1, y)


def _ce(x, y):
    return -torch.log_softmax(x, -1).gather(-1, y)


def _alternating(x):
    """+1, -1, +1, ... along the last axis: offsets whose sum cancels exactly."""
    signs = torch.ones(x.shape[-1])
    signs[1::2] = -1
    return signs


R = (8, 64)
LABELS = lambda x: torch.randint(0, 64, (8, 1))  # noqa: E731
PROBS = lambda x: torch.rand(R)  # noqa: E731

# name, naive, truth, shapes (or makers), extreme(x, dtype, position), declared input ranges
# (conditions and costs read declared ranges: the textbook cancellations need them to be seen)
CASES = [
    ("softmax", lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True),
     lambda x: torch.softmax(x, -1), [R], lambda x, d, i: x * 100, None),
    ("log_softmax", lambda x: torch.log(torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)),
     lambda x: torch.log_softmax(x, -1), [R], lambda x, d, i: x * 100, None),
    ("logsumexp", lambda x: torch.log(torch.exp(x).sum(-1)), lambda x: torch.logsumexp(x, -1),
     [R], lambda x, d, i: x * 100, None),
    ("log_softmax_via_lse", lambda x: x - torch.logsumexp(x, -1, keepdim=True),
     lambda x: torch.log_softmax(x, -1), [R], lambda x, d, i: x + BIG[d], None),
    ("attention", _naive_attention, _attention, [(2, 16, 32)] * 3,
     lambda x, d, i: x * 8 if i < 2 else x, None),
    ("cross_entropy", _naive_ce, _ce, [R, LABELS], lambda x, d, i: x * 100 if i == 0 else x, None),
    ("sigmoid_ratio", lambda x: torch.exp(x) / (1 + torch.exp(x)), torch.sigmoid, [R],
     lambda x, d, i: x * 100, None),
    ("log_sigmoid", lambda x: torch.log(_sig(x)), F.logsigmoid, [R], lambda x, d, i: x * 100, None),
    ("softplus", lambda x: torch.log(1 + torch.exp(x)), F.softplus, [R],
     lambda x, d, i: x * 100, None),
    ("bce_with_logits", _naive_bce, _bce, [R, PROBS], lambda x, d, i: x * 100 if i == 0 else x, None),
    ("tanh", lambda x: (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x)), torch.tanh,
     [R], lambda x, d, i: x * 100, None),
    ("logaddexp", lambda a, b: torch.log(torch.exp(a) + torch.exp(b)), torch.logaddexp, [R, R],
     lambda x, d, i: x * 100, None),
    ("log1p", lambda x: torch.log(1 + x), torch.log1p, [R], lambda x, d, i: x * 1e-5, None),
    ("expm1", lambda x: torch.exp(x) - 1, torch.expm1, [R], lambda x, d, i: x * 1e-5, None),
    ("one_minus_exp", lambda x: 1 - torch.exp(x), lambda x: -torch.expm1(x), [R],
     lambda x, d, i: x * 1e-5, None),
    ("exp_difference", lambda a, b: torch.exp(a) - torch.exp(b),
     lambda a, b: torch.exp(a) - torch.exp(b), [R, R], lambda x, d, i: x * 1e-5,
     {"a": (-3.0, 3.0), "b": (-3.0, 3.0)}),
    ("one_minus_cos", lambda x: 1 - torch.cos(x), lambda x: 2 * torch.sin(x / 2) ** 2, [R],
     lambda x, d, i: x * 1e-3, None),
    ("sqrt_difference", lambda x: torch.sqrt(x + 1) - torch.sqrt(x),
     lambda x: torch.sqrt(x + 1) - torch.sqrt(x), [R], lambda x, d, i: x.abs() + BIG[d],
     lambda d: {"x": (0.0, 2 * BIG[d])}),
    ("reciprocal_difference", lambda x: 1 / x - 1 / (x + 1), lambda x: 1 / (x * (x + 1)), [R],
     lambda x, d, i: x.abs() + BIG[d] / 10, None),
    ("variance_one_pass", lambda x: (x * x).mean(-1) - x.mean(-1) * x.mean(-1),
     lambda x: x.var(-1, unbiased=False), [R], lambda x, d, i: x + BIG[d] / 10, None),
    ("sum_cancelling", lambda x: x.sum(-1), lambda x: x.sum(-1), [R],
     lambda x, d, i: x + BIG[d] * _alternating(x), None),
    ("difference_of_squares", lambda a, b: a * a - b * b, lambda a, b: a * a - b * b, [R, R],
     lambda x, d, i: x + BIG[d] / 10, None),
    ("exp_product", lambda a, b: torch.exp(a) * torch.exp(b), lambda a, b: torch.exp(a + b),
     [R, R], lambda x, d, i: x + (100 if i == 0 else -100), None),
    ("exp_quotient", lambda a, b: torch.exp(a) / torch.exp(b), lambda a, b: torch.exp(a - b),
     [R, R], lambda x, d, i: x + 100, None),
    ("log_product", lambda a, b: torch.log(a * b), lambda a, b: torch.log(a) + torch.log(b),
     [R, R], lambda x, d, i: x.abs() * HUGE[d] + 1, {"a": (1e-30, 1e38), "b": (1e-30, 1e38)}),
    ("log_quotient", lambda a, b: torch.log(a / b), lambda a, b: torch.log(a) - torch.log(b),
     [R, R], lambda x, d, i: (x.abs() + 1) * (HUGE[d] if i == 0 else 1 / HUGE[d]),
     {"a": (1e-30, 1e38), "b": (1e-30, 1e38)}),
    ("log_power", lambda x: torch.log(x ** 3), lambda x: 3 * torch.log(x), [R],
     lambda x, d, i: x.abs() * HUGE[d] + 1, {"x": (1e-30, 1e38)}),
]


def error(out: torch.Tensor, truth: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    return float((out.double() - truth).abs().max() / truth.abs().max().clamp_min(1e-300))


def nonfinite(out: torch.Tensor) -> float:
    return float((~torch.isfinite(out)).float().mean())


def run_case(case, dtype, seed=0):
    name, naive, truth, makers, extreme, ranges = case
    ranges = ranges(dtype) if callable(ranges) else ranges
    gen = torch.Generator().manual_seed(seed)
    moderate = [m(None) if callable(m) else torch.randn(m, generator=gen) for m in makers]
    cast = [x.to(dtype) if x.is_floating_point() else x for x in moderate]
    optimized = saturate_and_extract(naive, input_ranges=ranges)
    optimized(*[x.abs().clamp(0.5, 5) if ranges else x for x in cast])  # trace: moderate inputs
    hard = [extreme(x, dtype, i).to(dtype) if x.is_floating_point() else x
            for i, x in enumerate(moderate)]
    reference = truth(*[x.double() if x.is_floating_point() else x for x in hard])
    out_naive, out_opt = naive(*hard), optimized(*hard)
    report = optimized.report
    return {
        "case": name, "dtype": str(dtype).removeprefix("torch."),
        "naive_err": error(out_naive, reference), "opt_err": error(out_opt, reference),
        "naive_nonfinite": nonfinite(out_naive), "opt_nonfinite": nonfinite(out_opt),
        "kappa_before": report.cost_before["curvature"], "kappa_after": report.cost_after["curvature"],
        "ok": error(out_opt, reference) <= TOL[dtype], "fallback": report.fallback,
    }


def main() -> int:
    torch.manual_seed(0)
    rows = [run_case(c, d) for c in CASES for d in (torch.float32, torch.float16)]
    head = (f"{'case':<22} {'dtype':<8} {'naive err':>10} {'opt err':>10} {'naive nonfin':>12} "
            f"{'opt nonfin':>10} {'kappa':>13} ok")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['case']:<22} {r['dtype']:<8} {r['naive_err']:10.2e} {r['opt_err']:10.2e} "
              f"{r['naive_nonfinite']:12.1%} {r['opt_nonfinite']:10.1%} "
              f"{r['kappa_before']:>6}->{r['kappa_after']:<6} {'yes' if r['ok'] else 'NO'}"
              + (f"  ({r['fallback']})" if r["fallback"] else ""))
    met = sum(r["ok"] for r in rows)
    print(f"\n{len(CASES)} cases x 2 dtypes: {met}/{len(rows)} within tolerance "
          f"(float32 {TOL[torch.float32]:g}, float16 {TOL[torch.float16]:g})")
    return 0 if met == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
