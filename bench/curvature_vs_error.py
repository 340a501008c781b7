"""Seed experiment (a): does curvature predict the float32 error that optimizing removes?

Random programs (seeded) are built around the naive spellings our rules catch, mixed with random
elementwise ops, each with random declared input ranges. Each is optimized with the default rules
for stability. Per program: curvature before and after, and the float32 error before and after,
in Herbie's measure: bits of error per output element, log2(1 + ulps from the correctly rounded
result), with the truth computed at 400 bits (mpmath) on the same float32 inputs. The inputs
(8 batches of 4 x 16 per program) come from ``egraph_opt.analysis.sampling``: uniform over the float32
numbers of the range (so values near zero are drawn), uniform by value, coincident pairs (y within
a few digits of x: a difference of functions of x and y cancels) and near-constant rows (a
reduction's spread cancels), half of them at an end of the range; endpoints included. Over the
programs that changed, the Spearman rank correlation of the curvature reduction with the reduction
of the worst-case bits of error, and with the mean (Herbie's average).

Curvature is measured three ways, all over the declared ranges:
- the program's first-order rounding error (``extractors/rounding_error.py``): each node's local
  error carried to the output by its derivative, the per-op condition numbers multiplied along
  every path; in bits, at 8 points of its own drawn by the same sampler (a seed of its own: never
  the points the error is measured at). It sees what the per-node costs cannot: coincidences,
  attenuation, saturation, underflow;
- the integer curvature cost (``cost_before/after["curvature"]``): what the extractor minimizes,
  priced with the saturated e-graph's intervals, one node at a time; decibels of error
  amplification per node, classes for unbounded growth, cancellation and overflow, and kappa as a
  tie-break;
- the analyzer's total kappa (``analyze_program(...).total``): the textbook sum of per-node kappa;
  infinite wherever a range reaches a singularity, and blind to cancellation (kappa of a
  subtraction is 0), so it is reported over the programs where it is finite before and after.

    python bench/curvature_vs_error.py [--n 400] [--seed 0]
"""
from __future__ import annotations

import argparse
import math
import operator
import random
import sys
import time

import mpmath
import numpy as np
import torch

from egraph_opt import optimize, pretty
from egraph_opt.drivers.analyzer import analyze_program
from egraph_opt.extractors import Objective
from egraph_opt.extractors.rounding_error import program_error
from egraph_opt.lang.program import Program, leaves
from egraph_opt.analysis.sampling import sample_inputs
from egraph_opt.lang.term import Term, evaluate, postorder

SHAPE = (4, 16)
BATCHES = 8  # input batches per program: 8 x 64 points
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


mpmath.mp.prec = 400  # exact enough for cancellations between float32 values of any exponent
MP_UNARY = {
    "exp": mpmath.exp, "expm1": mpmath.expm1, "neg": lambda v: -v, "abs": abs,
    "tanh": mpmath.tanh, "sigmoid": lambda v: 1 / (1 + mpmath.exp(-v)), "relu": lambda v: max(v, 0),
    "sin": mpmath.sin, "cos": mpmath.cos, "sqrt": lambda v: mpmath.sqrt(v) if v >= 0 else mpmath.nan,
    "log": lambda v: mpmath.log(v) if v > 0 else (mpmath.ninf if v == 0 else mpmath.nan),
    "log1p": lambda v: mpmath.log1p(v) if v > -1 else (mpmath.ninf if v == -1 else mpmath.nan),
}
MP_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "maximum": max,
             "div": lambda a, b: a / b if b else mpmath.nan if not a else mpmath.inf * mpmath.sign(a)}


def exact(term: Term, env: dict) -> torch.Tensor:
    """The term evaluated at 400 bits (mpmath) on the float32 inputs, rounded to float32: the
    correctly rounded result. float64 is not enough: exp(x) - 1 at x = 1e-20 is 0 in float64 too."""
    values: dict[int, np.ndarray] = {}
    for t in postorder([term]):
        if t.op == "const":
            values[id(t)] = np.array(mpmath.mpf(t.attrs[0]), dtype=object)
        elif t.op == "input":
            values[id(t)] = np.vectorize(mpmath.mpf, otypes=[object])(env[t.attrs[0]].double().numpy())
        elif t.op in ("sum", "mean"):
            (a,), (dim, keep) = [values[id(x)] for x in t.args], t.attrs
            total = np.sum(a, axis=dim, keepdims=keep)
            values[id(t)] = total / a.shape[dim] if t.op == "mean" else total
        else:
            f = MP_UNARY.get(t.op) or MP_BINARY[t.op]
            values[id(t)] = np.vectorize(f, otypes=[object])(*(values[id(x)] for x in t.args))
    with np.errstate(invalid="ignore"):  # NaN where the term is undefined: left out of the error
        return torch.tensor(np.vectorize(float, otypes=[float])(values[id(term)])).float()


def ulp_order(v: torch.Tensor) -> torch.Tensor:
    i = v.view(torch.int32).long()
    return torch.where(i < 0, -(i & 0x7FFFFFFF), i)


def bits_of_error(term: Term, env: dict, truth: torch.Tensor) -> torch.Tensor:
    """Per element, log2(1 + the number of float32 values between the result and the correctly
    rounded truth) (Herbie's measure): 0 when exact, 32 for NaN; where the truth is NaN, left out."""
    (out,) = evaluate([term], env)
    out = torch.as_tensor(out).float().expand_as(truth)
    ulps = (ulp_order(out) - ulp_order(truth)).abs().double()
    ulps = torch.where(torch.isnan(out), 2.0 ** 32, ulps)
    return torch.log2(1 + ulps)[~torch.isnan(truth)]


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
    envs = [sample_inputs({v: (SHAPE, "float32") for v in "xy"}, ranges, gen) for _ in range(BATCHES)]
    truths = [exact(term, env) for env in envs]
    if all(torch.isnan(t).all() for t in truths):
        return None
    program = Program((Term.input("x", SHAPE), Term.input("y", SHAPE)), term)
    result = optimize(program, objective=Objective.STABILITY, input_ranges=ranges)
    (after,) = leaves(result.program.outputs)
    seed = int(torch.randint(2 ** 31, (), generator=gen))  # points of its own, the same for both
    estimates = [program_error(p, ranges, points=BATCHES, seed=seed) for p in (program, result.program)]
    bits = [torch.cat([bits_of_error(t, env, truth) for env, truth in zip(envs, truths)])
            for t in (term, after)]
    return {
        "name": name, "term": term, "after": after, "changed": pretty(after) != pretty(term),
        "cost": (result.cost_before["curvature"], result.cost_after["curvature"]),
        "kappa": (analyze_program(program, ranges).total, analyze_program(result.program, ranges).total),
        "estimate": tuple(e.worst if e else math.nan for e in estimates),  # None: undefined at
        "estimate_mean": tuple(e.mean if e else math.nan for e in estimates),  # every point drawn
        "worst": tuple(float(b.max()) for b in bits), "mean": tuple(float(b.mean()) for b in bits),
        "rules": [r.name for r, _ in result.applied],
    }


def pattern_table(changed: list[dict]) -> str:
    """Per pattern: how many changed programs lost at least a bit of worst-case error, kept it
    (within a bit), or gained error, with the median curvature cost cut of the first two groups.
    Where the second median is as large as the first, the cost predicted a gain the measurement
    does not see."""
    head = (f"{'pattern':<22} {'changed':>7} {'error fell':>10} {'kept':>5} {'rose':>5} "
            f"{'median cost cut (fell)':>23} {'(kept)':>7}")
    rows = [f"\nby pattern\n{head}\n{'-' * len(head)}"]
    for name in sorted({r["name"] for r in changed}):
        group = [r for r in changed if r["name"] == name]
        fell = [r["cost_gain"] for r in group if r["error_gain"] >= 1]
        kept = [r["cost_gain"] for r in group if abs(r["error_gain"]) < 1]
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
        r["error_gain"] = r["worst"][0] - r["worst"][1]
        r["cost_gain"] = r["cost"][0] - r["cost"][1]
    print(f"{args.n} programs in {time.perf_counter() - start:.0f} s: {len(changed)} changed, "
          f"{args.n - skipped - len(changed)} unchanged, {skipped} skipped (reference nowhere defined)")
    better = sum(r["error_gain"] >= 1 for r in changed)
    worse = [r for r in changed if r["error_gain"] <= -1]
    print(f"changed programs: worst-case float32 error at least a bit lower in {better}, within a bit "
          f"in {len(changed) - better - len(worse)}, at least a bit higher in {len(worse)}")
    estimated = [r for r in changed if not any(map(math.isnan, r["estimate"]))]
    print(f"Spearman r(first-order error estimate reduction, worst-case bits removed) = "
          f"{spearman([r['estimate'][0] - r['estimate'][1] for r in estimated], [r['error_gain'] for r in estimated]):.3f}"
          f" over the {len(estimated)} changed programs defined somewhere at the estimate's points")
    print(f"Spearman r(first-order mean estimate reduction, mean bits removed)       = "
          f"{spearman([r['estimate_mean'][0] - r['estimate_mean'][1] for r in estimated], [r['mean'][0] - r['mean'][1] for r in estimated]):.3f}")
    cost_gains = [r["cost_gain"] for r in changed]
    print(f"Spearman r(curvature cost reduction, worst-case bits of error removed) = "
          f"{spearman(cost_gains, [r['error_gain'] for r in changed]):.3f} over {len(changed)} programs")
    print(f"Spearman r(curvature cost reduction, mean bits of error removed)       = "
          f"{spearman(cost_gains, [r['mean'][0] - r['mean'][1] for r in changed]):.3f}")
    finite = [r for r in changed if all(0 < k < math.inf for k in r["kappa"])]
    print(f"Spearman r(log10 total-kappa reduction, worst-case bits removed)        = "
          f"{spearman([math.log10(r['kappa'][0] / r['kappa'][1]) for r in finite], [r['error_gain'] for r in finite]):.3f}"
          f" over the {len(finite)} changed programs whose total kappa is finite and nonzero before and after")
    print(pattern_table(changed))
    head = (f"{'pattern':<22} {'curv. cost':>13} {'total kappa':>19} {'worst bits':>10} "
            f"{'after':>5}  rewrites")
    print(f"\nlargest error reductions\n{head}\n{'-' * len(head)}")
    for r in sorted(changed, key=lambda r: -r["error_gain"])[:10]:
        print(f"{r['name']:<22} {r['cost'][0]:>6}->{r['cost'][1]:<6} {r['kappa'][0]:>9.2g}->"
              f"{r['kappa'][1]:<9.2g} {r['worst'][0]:>10.1f} {r['worst'][1]:>5.1f}  "
              f"{', '.join(r['rules']) or '(none reported)'}")
    for r in worse:
        print(f"\n[WORSE] {r['name']}: worst-case bits of error {r['worst'][0]:.1f} -> {r['worst'][1]:.1f}\n"
              f"  before: {pretty(r['term'])}\n  after:  {pretty(r['after'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
