"""Seed experiment (a): does the curvature the extractor minimizes predict the float32 error that
optimizing removes?

Random programs (seeded) are built around the naive spellings our rules catch, mixed with random
elementwise ops, each with random declared input ranges and inputs inside them (endpoints
included). Each is optimized with the default rules for stability. Per program: curvature before and
after, and the float32 output error (max error over the output's scale, against float64 evaluated
on the same float32 inputs) before and after. Over the programs that changed, the Spearman rank
correlation of curvature reduction with log error reduction.

Curvature is measured two ways, both over the declared ranges:
- the integer curvature cost (``cost_before/after["curvature"]``): what the extractor minimizes;
  decibels of kappa per node plus penalties for unbounded growth, cancellation and overflow, so a
  difference of costs is already a log-kappa reduction, defined for every program;
- the analyzer's total kappa (``analyze_program(...).total``): the textbook sum of per-node kappa;
  infinite wherever a range reaches a singularity, and blind to cancellation (kappa of a
  subtraction is 0), so it is reported over the programs where it is finite before and after.

    python bench/curvature_vs_error.py [--n 400] [--seed 0]
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time

import numpy as np
import torch

from egraph_opt import optimize, pretty
from egraph_opt.analyzer import analyze_program
from egraph_opt.extractors import Objective
from egraph_opt.program import Program, leaves
from egraph_opt.term import Term, evaluate

SHAPE = (4, 16)
#: error floor (4 float32 unit roundoffs: differences below it are rounding noise, not a change of
#: accuracy) and cap (a non-finite output counts as the cap), so log error ratios stay finite
FLOOR, CAP = 2.0 ** -22, 1e8
RANGES = {
    "moderate": (-3.0, 3.0), "wide": (-100.0, 100.0), "tiny": (-1e-4, 1e-4),
    "small": (-1e-2, 1e-2), "small_pos": (1e-6, 1e-2), "large_pos": (1e3, 1e7),
    "offset": (1e3, 1.01e3), "far_offset": (1e4, 1.0001e4), "huge_pos": (1e15, 1e25),
}


def op(name: str, *args: Term, attrs: tuple = ()) -> Term:
    return Term(name, args, attrs)


def naive_softmax(x: Term) -> Term:
    e = op("exp", x)
    return op("div", e, op("sum", e, attrs=(-1, True)))


def mean(x: Term) -> Term:
    return op("mean", x, attrs=(-1, True))


ONE = Term.const(1.0)
# name: (build(x, y), range kinds its inputs are drawn from)
PATTERNS = {
    "softmax": (lambda x, y: naive_softmax(x), ("moderate", "wide")),
    "log_softmax": (lambda x, y: op("log", naive_softmax(x)), ("moderate", "wide")),
    "logsumexp": (lambda x, y: op("log", op("sum", op("exp", x), attrs=(-1, True))), ("moderate", "wide")),
    "softplus": (lambda x, y: op("log", op("add", ONE, op("exp", x))), ("moderate", "wide")),
    "sigmoid_ratio": (lambda x, y: op("div", op("exp", x), op("add", ONE, op("exp", x))), ("moderate", "wide")),
    "logaddexp": (lambda x, y: op("log", op("add", op("exp", x), op("exp", y))), ("moderate", "wide")),
    "tanh_from_exp": (lambda x, y: op("div", op("sub", op("exp", x), op("exp", op("neg", x))),
                                      op("add", op("exp", x), op("exp", op("neg", x)))), ("moderate", "wide")),
    "log1p": (lambda x, y: op("log", op("add", ONE, x)), ("tiny", "small", "small_pos")),
    "expm1": (lambda x, y: op("sub", op("exp", x), ONE), ("tiny", "small", "moderate")),
    "one_minus_exp": (lambda x, y: op("sub", ONE, op("exp", x)), ("tiny", "small")),
    "exp_difference": (lambda x, y: op("sub", op("exp", x), op("exp", y)), ("tiny", "small")),
    "one_minus_cos": (lambda x, y: op("sub", ONE, op("cos", x)), ("tiny", "small")),
    "difference_of_squares": (lambda x, y: op("sub", op("mul", x, x), op("mul", y, y)),
                              ("offset", "far_offset", "moderate")),
    "exp_product": (lambda x, y: op("mul", op("exp", x), op("exp", y)), ("moderate", "wide")),
    "exp_quotient": (lambda x, y: op("div", op("exp", x), op("exp", y)), ("moderate", "wide")),
    "sqrt_difference": (lambda x, y: op("sub", op("sqrt", op("add", x, ONE)), op("sqrt", x)),
                        ("small_pos", "large_pos")),
    "reciprocal_difference": (lambda x, y: op("sub", op("div", ONE, x), op("div", ONE, op("add", x, ONE))),
                              ("large_pos", "offset")),
    "variance_one_pass": (lambda x, y: op("sub", mean(op("mul", x, x)), op("mul", mean(x), mean(x))),
                          ("offset", "far_offset", "moderate")),
    "log_product": (lambda x, y: op("log", op("mul", x, y)), ("huge_pos", "large_pos")),
}
MIX_UNARY = ["neg", "abs", "tanh", "sigmoid", "relu", "sin"]
MIX_BINARY = ["add", "sub", "mul"]
RANDOM_UNARY = ["exp", "log", "neg", "tanh", "sigmoid", "abs", "sqrt", "log1p", "expm1", "cos"]
RANDOM_BINARY = ["add", "sub", "mul", "div", "maximum"]


def random_elementwise(rng: random.Random, x: Term, y: Term, depth: int) -> Term:
    if depth == 0 or rng.random() < 0.3:
        return rng.choice([x, y, Term.const(rng.choice([0.5, 1.0, 2.0]))])
    if rng.random() < 0.5:
        return op(rng.choice(RANDOM_UNARY), random_elementwise(rng, x, y, depth - 1))
    return op(rng.choice(RANDOM_BINARY), *(random_elementwise(rng, x, y, depth - 1) for _ in "ab"))


def program(rng: random.Random) -> tuple[str, Term, dict]:
    """One random program: its pattern's name, its term over x and y, the declared ranges."""
    x, y = Term.input("x", SHAPE), Term.input("y", SHAPE)
    name = rng.choice(list(PATTERNS) + ["random"] * 3)
    if name == "random":
        kinds = ("moderate",)
        term = random_elementwise(rng, x, y, 3)
        while term.op in ("input", "const"):
            term = random_elementwise(rng, x, y, 3)
    else:
        build, kinds = PATTERNS[name]
        scale = Term.const(rng.choice([0.5, 2.0]))  # the pattern's operand as a subterm, sometimes
        term = build(*(op("mul", v, scale) if rng.random() < 0.3 else v for v in (x, y)))
    if rng.random() < 0.5:  # the pattern inside a random elementwise context
        if rng.random() < 0.5:
            term = op(rng.choice(MIX_UNARY), term)
        else:
            term = op(rng.choice(MIX_BINARY), term, rng.choice([y, Term.const(0.5), op("tanh", x)]))
    jitter = [2.0 ** rng.uniform(-1, 1) for _ in "xy"]
    ranges = {v: tuple(e * j for e in RANGES[rng.choice(kinds)]) for v, j in zip("xy", jitter)}
    return name, term, ranges


def sample(lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    """float32 values in [lo, hi], log-uniform over ranges spanning decades, endpoints included."""
    u = torch.rand(SHAPE, generator=gen, dtype=torch.float64)
    value = lo * (hi / lo) ** u if lo > 0 and hi / lo > 10 else lo + (hi - lo) * u
    value.view(-1)[:2] = torch.tensor([lo, hi], dtype=torch.float64)
    return value.float()


def float32_error(term: Term, env: dict, truth: torch.Tensor) -> float:
    (out,) = evaluate([term], env)
    out = torch.as_tensor(out).double()
    finite = torch.isfinite(truth)
    if not torch.isfinite(out[finite]).all():
        return CAP
    scale = float(truth[finite].abs().max()) or 1.0
    return min(max(float((out[finite] - truth[finite]).abs().max()) / scale, FLOOR), CAP)


def spearman(a, b) -> float:
    """Rank correlation (ties share their mean rank): Pearson correlation of the ranks."""
    def ranks(v):
        v = np.asarray(v, dtype=float)
        position = np.empty(len(v))
        position[np.argsort(v, kind="stable")] = np.arange(len(v))
        _, group, counts = np.unique(v, return_inverse=True, return_counts=True)
        return (np.bincount(group, weights=position) / counts)[group]
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def measure(name: str, term: Term, ranges: dict, gen: torch.Generator) -> dict | None:
    env = {v: sample(*ranges[v], gen) for v in "xy"}
    (truth,) = evaluate([term], env, reference=True)
    truth = torch.as_tensor(truth)
    if not torch.isfinite(truth).any():
        return None
    program = Program((Term.input("x", SHAPE), Term.input("y", SHAPE)), term)
    result = optimize(program, objective=Objective.STABILITY, input_ranges=ranges)
    (after,) = leaves(result.program.outputs)
    return {
        "name": name, "term": term, "after": after, "changed": pretty(after) != pretty(term),
        "cost": (result.cost_before["curvature"], result.cost_after["curvature"]),
        "kappa": (analyze_program(program, ranges).total, analyze_program(result.program, ranges).total),
        "error": (float32_error(term, env, truth), float32_error(after, env, truth)),
        "rules": [r.name for r, _ in result.applied],
    }


def pattern_table(changed: list[dict]) -> str:
    """Per pattern: how many changed programs got more accurate and how many kept their error,
    with the median curvature cost reduction of each group. Where the second median is as large
    as the first, the cost predicted a gain the measurement does not see: that pattern's ties
    are what keep r down."""
    head = (f"{'pattern':<22} {'changed':>7} {'error fell':>10} {'kept':>5} {'rose':>5} "
            f"{'median cost cut (fell)':>23} {'(kept)':>7}")
    rows = [f"\nby pattern\n{head}\n{'-' * len(head)}"]
    for name in sorted({r["name"] for r in changed}):
        group = [r for r in changed if r["name"] == name]
        fell = [r["cost_gain"] for r in group if r["error_gain"] > 0]
        kept = [r["cost_gain"] for r in group if r["error_gain"] == 0]
        median = lambda v: f"{np.median(v):.0f}" if v else "-"  # noqa: E731
        rows.append(f"{name:<22} {len(group):>7} {len(fell):>10} {len(kept):>5} "
                    f"{len(group) - len(fell) - len(kept):>5} {median(fell):>23} {median(kept):>7}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng, gen = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    rows = [measure(*program(rng), gen) for _ in range(args.n)]
    skipped = sum(r is None for r in rows)
    changed = [r for r in rows if r and r["changed"]]
    for r in changed:
        r["error_gain"] = math.log10(r["error"][0] / r["error"][1])
        r["cost_gain"] = r["cost"][0] - r["cost"][1]
    print(f"{args.n} programs in {time.perf_counter() - start:.0f} s: {len(changed)} changed, "
          f"{args.n - skipped - len(changed)} unchanged, {skipped} skipped (reference nowhere finite)")
    better = sum(r["error_gain"] > 0 for r in changed)
    worse = [r for r in changed if r["error_gain"] < 0]
    print(f"changed programs: float32 error lower in {better}, equal in "
          f"{len(changed) - better - len(worse)}, higher in {len(worse)}")
    gains = [r["error_gain"] for r in changed]
    print(f"Spearman r(curvature cost reduction, log10 error reduction) = "
          f"{spearman([r['cost_gain'] for r in changed], gains):.3f} over {len(changed)} programs")
    moved = [r for r in changed if r["error_gain"] != 0]
    print(f"Spearman r(curvature cost reduction, log10 error reduction) = "
          f"{spearman([r['cost_gain'] for r in moved], [r['error_gain'] for r in moved]):.3f} over the "
          f"{len(moved)} changed programs whose error changed")
    finite = [r for r in changed if all(0 < k < math.inf for k in r["kappa"])]
    print(f"Spearman r(log10 total-kappa reduction, log10 error reduction) = "
          f"{spearman([math.log10(r['kappa'][0] / r['kappa'][1]) for r in finite], [r['error_gain'] for r in finite]):.3f}"
          f" over the {len(finite)} changed programs whose total kappa is finite and nonzero before and after")
    print(pattern_table(changed))
    head = (f"{'pattern':<22} {'curv. cost':>13} {'total kappa':>19} {'f32 err before':>14} "
            f"{'after':>9}  rewrites")
    print(f"\nlargest float32 error reductions\n{head}\n{'-' * len(head)}")
    for r in sorted(changed, key=lambda r: -r["error_gain"])[:10]:
        print(f"{r['name']:<22} {r['cost'][0]:>6}->{r['cost'][1]:<6} {r['kappa'][0]:>9.2g}->"
              f"{r['kappa'][1]:<9.2g} {r['error'][0]:>14.2e} {r['error'][1]:>9.2e}  {', '.join(r['rules']) or '(none reported)'}")
    for r in worse:
        print(f"\n[WORSE] {r['name']}: error {r['error'][0]:.2e} -> {r['error'][1]:.2e}\n"
              f"  before: {pretty(r['term'])}\n  after:  {pretty(r['after'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
