"""Scaling: GPT-2-shaped stacks of 1, 4, 12 and 48 naive blocks (layer norm from mean/var, causal
naive attention, tanh-gelu MLP), captured and optimized. Repeated blocks are optimized once as a
template; the whole-program figure (templates off) is printed beside it for comparison.

Goal: 12 blocks <= 5 s, 48 blocks <= 1.5x the 12-block time.

    python bench/scaling.py [--blocks 1 4 12 48] [--width 768]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn as nn

from egraph_opt import capture, optimize
from fusion import NaiveBlock  # the naive GPT-2-style block of bench/fusion.py


class GPT2Stack(nn.Module):
    def __init__(self, blocks: int, c: int, t: int):
        super().__init__()
        self.h = nn.ModuleList([NaiveBlock(c, 4, t) for _ in range(blocks)])

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return x


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 4, 12, 48])
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    optimize(capture(GPT2Stack(1, 64, 8).eval(), (torch.randn(1, 8, 64),))[0])  # warm the caches
    print(f"{'blocks':>6} {'terms':>7} {'capture s':>9} {'optimize s':>10} {'e-nodes':>8} "
          f"{'whole-program s':>15} {'e-nodes':>8}  ops after")
    times = {}
    for n in args.blocks:
        model = GPT2Stack(n, args.width, args.tokens).eval()
        example = (torch.randn(1, args.tokens, args.width),)
        start = time.perf_counter()
        program, _ = capture(model, example)
        captured = time.perf_counter() - start
        start = time.perf_counter()
        result = optimize(program)
        times[n] = time.perf_counter() - start
        start = time.perf_counter()
        whole = optimize(program, templates=False) if n <= 12 else None
        whole_s = time.perf_counter() - start
        terms = sum(result.ops_before.values())
        enodes = sum(s.enodes for s in result.saturation)
        print(f"{n:>6} {terms:>7} {captured:>9.2f} {times[n]:>10.2f} {enodes:>8} "
              + (f"{whole_s:>15.2f} {sum(s.enodes for s in whole.saturation):>8}" if whole
                 else f"{'(skipped)':>15} {'':>8}")
              + f"  {dict(sorted(result.ops_after.items(), key=lambda kv: -kv[1])[:5])}")
    if 12 in times and 48 in times:
        ratio = times[48] / times[12]
        print(f"\n12 blocks: {times[12]:.2f} s (goal <= 5 s: {'met' if times[12] <= 5 else 'NOT met'}); "
              f"48/12 = {ratio:.2f}x (goal <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
