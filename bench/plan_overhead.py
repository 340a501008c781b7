"""What a plan costs besides running it: the per-call check of its key, and the memory each extra
input signature holds.

    python bench/plan_overhead.py [--calls 20000]

Key check: a 100-parameter module (50 submodules) called through the decorator against its
plan's runner called directly, call by call, medians; the difference is the bind + key + lookup
(goal: <= 5 us). The same for a plan that fell back (a branch on a value cannot be traced: the
original runs), against the original called directly: what the never-slower check's fallback
costs. Memory: resident set growth over 20 extra signatures of a 3-op function
(goal: <= 20 MB each), with and without ``keep_egraph``.
"""
from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time
import warnings

import torch
import torch.nn as nn

from egraph_opt import saturate_and_extract


def _rss_mb() -> float:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2 ** 20


class _Wide(nn.Module):
    """100 parameters in 50 submodules, of which the program reads one: the plan runs in a few
    microseconds, so the key check is not lost in the noise of running it."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(1, 1) for _ in range(50))

    def forward(self, x):
        return torch.exp(x) * self.layers[0].weight


class _Branching(_Wide):
    """Decides on a value: tracing refuses it, so its plan is the original."""

    def forward(self, x):
        return torch.exp(x) * self.layers[0].weight if bool(x.sum() < 1e30) else x


def key_overhead(calls: int, fallback: bool = False) -> tuple[float, int]:
    model = (_Branching() if fallback else _Wide()).eval()
    params = sum(1 for _ in model.parameters())
    f = saturate_and_extract(model, validate=False, profile_budget=0)  # never measured slower
    x = torch.randn(1, 2)
    with torch.no_grad():
        f(x)
        run = next(iter(f.plans.values())).run
        if fallback:
            assert f.report.fallback, "the branching module was optimized"
            run = model
        through, direct = [], []
        for _ in range(calls):  # interleaved calls: the machine's load hits both alike
            for target, out in ((f, through), (run, direct)):
                start = time.perf_counter()
                target(x)
                out.append(time.perf_counter() - start)
    return (statistics.median(through) - statistics.median(direct)) * 1e6, params


def memory_per_signature(keep: bool) -> float:
    f = saturate_and_extract(lambda x: torch.log(1 + torch.exp(x)) * 2, keep_egraph=keep)
    for n in range(2, 6):  # warm up allocators and caches
        f(torch.randn(n))
    base = _rss_mb()
    for n in range(6, 26):
        f(torch.randn(n))
    return (_rss_mb() - base) / 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    us, params = key_overhead(args.calls)
    print(f"key check per call, {params}-parameter module: {us:.2f} us (goal <= 5 us)")
    us, _ = key_overhead(args.calls, fallback=True)
    print(f"the same, its plan fallen back to the original: {us:.2f} us")
    for keep in (False, True):
        print(f"memory per extra signature, keep_egraph={keep}: {memory_per_signature(keep):.1f} MB"
              + (" (goal <= 20 MB)" if not keep else ""))


if __name__ == "__main__":
    main()
