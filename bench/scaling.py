"""Scaling: GPT-2-shaped stacks of 1, 4, 12 and 48 naive blocks (layer norm from mean/var, causal
naive attention, tanh-gelu MLP), captured and optimized. Repeated blocks are optimized once as a
template; the whole-program figure (templates off) is printed beside it for comparison. Two forms
of the same stack: an nn.ModuleList of blocks (repeats known from the module items) and a plain
function looping over a list of parameter dicts (repeats found by structure).

Goal (issue 18): 12 blocks <= 2 s, 48 blocks <= 1.5x the 12-block time, in both forms: medians of
``--repeats`` optimize runs per stack, interleaved, each after a garbage collection (one run apiece
gave 48/12 anywhere from 0.7x to 3.1x on a shared 2-core machine).

    python bench/scaling.py [--blocks 1 4 12 48] [--width 768] [--repeats 3]
"""
from __future__ import annotations

import argparse
import gc
import math
import statistics
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


def plain_stack(blocks: int, c: int, t: int):
    """The same blocks as a plain function closing over a list of parameter dicts."""
    weights = [dict(NaiveBlock(c, 4, t).named_parameters()) for _ in range(blocks)]
    mask, heads = torch.ones(t, t, dtype=torch.bool).triu(1), 4

    def forward(x):
        b, t_, c_ = x.shape
        for p in weights:
            h = NaiveBlock.norm(x, p["ln1_w"], p["ln1_b"]) @ p["qkv.weight"].T + p["qkv.bias"]
            q, k, v = (y.view(b, t_, heads, c_ // heads).transpose(1, 2) for y in h.split(c_, -1))
            s = (q @ k.transpose(-2, -1) / math.sqrt(c_ // heads)).masked_fill(mask, float("-inf"))
            x = x + (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, t_, c_) @ p["proj.weight"].T
            x = x + p["proj.bias"]
            g = NaiveBlock.norm(x, p["ln2_w"], p["ln2_b"]) @ p["fc.weight"].T + p["fc.bias"]
            g = 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * torch.pow(g, 3.0))))
            x = x + g @ p["out.weight"].T + p["out.bias"]
        return x
    return forward


FORMS = {"module": lambda n, c, t: GPT2Stack(n, c, t).eval(), "function": plain_stack}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 4, 12, 48])
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="optimize runs per stack, interleaved (median)")
    args = parser.parse_args()
    torch.manual_seed(0)
    optimize(capture(GPT2Stack(1, 64, 8).eval(), (torch.randn(1, 8, 64),))[0])  # warm the caches
    print(f"{'form':>8} {'blocks':>6} {'terms':>7} {'capture s':>9} {'optimize s':>10} {'e-nodes':>8} "
          f"{'whole-program s':>15} {'e-nodes':>8}  ops after")
    times: dict[tuple[str, int], list[float]] = {}
    programs = {}
    for n in args.blocks:  # the two forms interleaved, block count by block count
        for form, build in FORMS.items():
            model = build(n, args.width, args.tokens)
            example = (torch.randn(1, args.tokens, args.width),)
            start = time.perf_counter()
            program, _ = capture(model, example)
            captured = time.perf_counter() - start
            programs[form, n] = program
            gc.collect()  # no collection of an earlier run's garbage lands in this one's time
            start = time.perf_counter()
            result = optimize(program)
            times[form, n] = [time.perf_counter() - start]
            start = time.perf_counter()
            whole = optimize(program, templates=False) if n <= 4 else None
            whole_s = time.perf_counter() - start
            terms = sum(result.ops_before.values())
            enodes = sum(s.enodes for s in result.saturation)
            print(f"{form:>8} {n:>6} {terms:>7} {captured:>9.2f} {times[form, n][0]:>10.2f} {enodes:>8} "
                  + (f"{whole_s:>15.2f} {sum(s.enodes for s in whole.saturation):>8}" if whole
                     else f"{'(skipped)':>15} {'':>8}")
                  + f"  {dict(sorted(result.ops_after.items(), key=lambda kv: -kv[1])[:5])}")
    for _ in range(args.repeats - 1):  # again, interleaved: one slow moment of a shared machine is
        for (form, n), program in programs.items():  # one sample of several
            gc.collect()
            start = time.perf_counter()
            optimize(program)
            times[form, n].append(time.perf_counter() - start)
    times = {k: statistics.median(v) for k, v in times.items()}
    print(f"optimize s, median of {args.repeats} interleaved runs: "
          + ", ".join(f"{form} {n}: {t:.2f}" for (form, n), t in times.items()))
    for form in FORMS:
        if (form, 12) in times and (form, 48) in times:
            t12, ratio = times[form, 12], times[form, 48] / times[form, 12]
            print(f"{form}: 12 blocks {t12:.2f} s (goal <= 2 s: {'met' if t12 <= 2 else 'NOT met'}); "
                  f"48/12 = {ratio:.2f}x (goal <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
