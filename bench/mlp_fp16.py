"""Seed experiment (b): float16 error of small models before and after optimization.

MLPs and small CNNs with random weights (some with a naive softmax or log-softmax head written with
exp/sum/log, or a naive layer norm written with one-pass mean/variance) run in float16; the truth is
the same model (its float16-rounded weights) in float64 on the same float16 inputs, so only the
arithmetic is measured. The optimized program (saturate_and_extract, objective "stability", traced
once on moderate inputs) runs in float16 too. Error: max error over the output's scale, averaged
over TRIALS batches (one batch's maximum is noisy). Seed target: 30-60% lower error. The floor is
the error of the truth rounded to float16: no program whose output is float16 can do better, so
"possible" is the largest reduction any optimization could reach.

    python bench/mlp_fp16.py
"""
from __future__ import annotations

import copy
import math
import sys
import time

import torch
from torch import nn

from egraph_opt import saturate_and_extract

SCALES = {"moderate": 1.0, "large": 30.0, "huge": 300.0}  # input scale; activations follow it
BATCH, TRIALS = 64, 10


def naive_softmax(h):
    return torch.exp(h) / torch.exp(h).sum(-1, keepdim=True)


HEADS = {
    "logits": lambda h: h,
    "softmax": naive_softmax,
    "log_softmax": lambda h: torch.log(naive_softmax(h)),
}


class NaiveLayerNorm(nn.Module):
    """(x - E[x]) / sqrt(E[x^2] - E[x]^2 + eps): the one-pass variance cancels and x^2 overflows
    float16 for activations above 256."""

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt((x * x).mean(-1, keepdim=True) - mu * mu + 1e-5)


class Net(nn.Module):
    def __init__(self, body: nn.Module, head: str):
        super().__init__()
        self.body, self.head = body, head

    def forward(self, x):
        return HEADS[self.head](self.body(x))


def mlp(widths: list[int], norm: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers += [NaiveLayerNorm()] * norm + [nn.ReLU()]
    return nn.Sequential(*layers)


def cnn(norm: bool = False) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         *[NaiveLayerNorm()] * norm, nn.Linear(8 * 4 * 4, 10))


MODELS = {  # name: (body, head, input shape without batch)
    "mlp2": (lambda: mlp([32, 64, 10]), "logits", (32,)),
    "mlp4": (lambda: mlp([32, 64, 64, 64, 10]), "logits", (32,)),
    "mlp3 softmax head": (lambda: mlp([32, 64, 64, 10]), "softmax", (32,)),
    "mlp3 log-softmax head": (lambda: mlp([32, 64, 64, 10]), "log_softmax", (32,)),
    "mlp3 layer norm": (lambda: mlp([32, 64, 64, 10], norm=True), "logits", (32,)),
    "cnn": (cnn, "logits", (3, 8, 8)),
    "cnn log-softmax head": (cnn, "log_softmax", (3, 8, 8)),
    "cnn layer norm + softmax": (lambda: cnn(norm=True), "softmax", (3, 8, 8)),
}


def error(out: torch.Tensor, truth: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    return float((out.double() - truth).abs().max() / truth.abs().max().clamp_min(1e-300))


def reduction(naive: float, opt: float) -> str:
    if math.isinf(naive):
        return "100% (naive non-finite)" if math.isfinite(opt) else "n/a (both non-finite)"
    return f"{100 * (1 - opt / naive):.0f}%" if naive > 0 else "n/a"


def run_model(name: str, seed: int = 0) -> list[str]:
    make, head, shape = MODELS[name]
    torch.manual_seed(seed)
    model = Net(make(), head).eval()
    half = copy.deepcopy(model).half()
    wide = copy.deepcopy(half).double()
    optimized = saturate_and_extract(half, objective="stability")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        optimized(torch.randn(BATCH, *shape, generator=gen).half())  # trace on moderate inputs
        lines = [f"\n{name}\n{'scale':<10} {'fp16 naive':>11} {'fp16 opt':>11} {'floor':>11}  "
                 f"{'reduction':<24} {'possible':>8}"]
        for label, scale in SCALES.items():
            errors = torch.zeros(3, dtype=torch.float64)
            for _ in range(TRIALS):
                x = (torch.randn(BATCH, *shape, generator=gen) * scale).half()
                truth = wide(x.double())
                errors += torch.tensor([error(half(x), truth), error(optimized(x), truth),
                                        error(truth.half(), truth)]) / TRIALS
            naive, opt, floor = errors.tolist()
            lines.append(f"{label:<10} {naive:11.3e} {opt:11.3e} {floor:11.3e}  "
                         f"{reduction(naive, opt):<24} {reduction(naive, floor):>8}")
    report = optimized.report
    lines.append("rewrites: " + (", ".join(n for n, _, _ in report.rewrites) or "none (no rule applies)"))
    if report.fallback:
        lines.append(f"FALLBACK: {report.fallback}")
    return lines


def main() -> int:
    start = time.perf_counter()
    for name in MODELS:
        print("\n".join(run_model(name)))
    print(f"\n{len(MODELS)} models in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
