"""Fuzzer: random programs, optimized with every rule that is not unsafe, must agree with the
original in float64 wherever the original is finite (same shape, finite there, within 1e-9 of the
output's scale).

Every program comes from its own seed, so a disagreement is reproduced by ``program(seed)`` and kept
verbatim (its s-expression and seed) in tests/test_fuzz_regressions.py. Half the programs declare
input ranges and draw their inputs inside them, so guarded rules and the range analysis are tried
too; y's shape varies so broadcasting and reductions over size-1 axes are tried as well.

    python bench/fuzz.py --n 1000 [--seed S]
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import torch

from egraph_opt import Limits, optimize, pretty
from egraph_opt import pattern as pat
from egraph_opt.extractors import Objective
from egraph_opt.program import Program, leaves
from egraph_opt.rulesets import select
from egraph_opt.ops import parse_shape
from egraph_opt.term import Term, evaluate, postorder

TOLERANCE = 1e-9
LIMITS = Limits(max_iterations=15, max_enodes=5_000, max_seconds=2.0)  # keeps one program < ~1 s
X_SHAPE, Y_SHAPES = (3, 4), [(3, 4), (1, 4), (3, 1)]
CONSTS = [0.0, 0.5, 1.0, 2.0, 3.0, -1.0]  # 0 and 1 make the identity rules (add-zero, mul-one) fire
RANGES = [(-3.0, 3.0), (0.1, 10.0), (-1e-3, 1e-3), (1.0, 50.0), (-50.0, -1.0), (0.0, 1.0)]
UNARY = ["exp", "log", "neg", "tanh", "sigmoid", "abs", "sqrt", "log1p", "expm1", "relu"]
BINARY = ["add", "sub", "mul", "div", "maximum", "pow"]


def op(name: str, *args: Term, attrs: tuple = ()) -> Term:
    return Term(name, args, attrs)


def naive_softmax(t: Term) -> Term:
    e = op("exp", t)
    return op("div", e, op("sum", e, attrs=(-1, True)))


ONE = Term.const(1.0)
SHAPED = {  # spellings the rules look for, so random programs exercise them
    "softmax_naive": naive_softmax,
    "log_softmax_naive": lambda t: op("log", naive_softmax(t)),
    "lse_naive": lambda t: op("log", op("sum", op("exp", t), attrs=(-1, True))),
    "max_shift": lambda t: op("sub", t, op("max", t, attrs=(-1, True))),
    "mean": lambda t: op("mean", t, attrs=(-1, True)),
    "softmax": lambda t: op("softmax", t, attrs=(-1,)),
    "log_one_plus": lambda t: op("log", op("add", ONE, t)),
    "exp_minus_one": lambda t: op("sub", op("exp", t), ONE),
    "one_minus_cos": lambda t: op("sub", ONE, op("cos", t)),
    "sigmoid_ratio": lambda t: op("div", op("exp", t), op("add", ONE, op("exp", t))),
    "square": lambda t: op("mul", t, t),
    "scaled": lambda t: op("div", t, Term.const(3.0)),
    "variance_one_pass": lambda t: op("sub", op("mean", op("mul", t, t), attrs=(-1, True)),
                                      op("mul", *[op("mean", t, attrs=(-1, True))] * 2)),
}
PAIRED = {
    "difference_of_squares": lambda a, b: op("sub", op("mul", a, a), op("mul", b, b)),
    "exp_product": lambda a, b: op("mul", op("exp", a), op("exp", b)),
    "exp_quotient": lambda a, b: op("div", op("exp", a), op("exp", b)),
    "exp_difference": lambda a, b: op("sub", op("exp", a), op("exp", b)),
    "logaddexp_naive": lambda a, b: op("log", op("add", op("exp", a), op("exp", b))),
    "log_product": lambda a, b: op("log", op("mul", a, b)),
    "log_quotient": lambda a, b: op("log", op("div", a, b)),
}


def program(seed: int, depth: int = 3) -> tuple[Term, dict]:
    """The random program of ``seed``: a term over x and y and its declared input ranges."""
    rng = random.Random(seed)
    x = Term.input("x", X_SHAPE, "float64")
    y = Term.input("y", rng.choice(Y_SHAPES), "float64")

    def grow(level: int) -> Term:
        if level == 0 or rng.random() < 0.25:
            return rng.choice([x, y, Term.const(rng.choice(CONSTS))])
        kind = rng.random()
        if kind < 0.3:
            return op(rng.choice(UNARY), grow(level - 1))
        if kind < 0.55:
            return op(rng.choice(BINARY), grow(level - 1), grow(level - 1))
        if kind < 0.85:
            return rng.choice(list(SHAPED.values()))(grow(level - 1))
        return rng.choice(list(PAIRED.values()))(grow(level - 1), grow(level - 1))

    term = grow(depth)
    while term.op in ("input", "const"):
        term = grow(depth)
    ranges = {name: rng.choice(RANGES) for name in "xy"} if rng.random() < 0.5 else None
    return term, ranges


def inputs(term: Term, ranges: dict | None, seed: int) -> dict[str, torch.Tensor]:
    """float64 values for the term's inputs: inside declared ranges (endpoints included), else
    standard normal."""
    gen = torch.Generator().manual_seed(seed)
    env = {}
    for name, shape in input_shapes(term).items():
        if ranges and name in ranges:
            lo, hi = ranges[name]
            value = lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)
            value.view(-1)[:2] = torch.tensor([lo, hi], dtype=torch.float64)
        else:
            value = torch.randn(shape, generator=gen, dtype=torch.float64)
        env[name] = value
    return env


def input_shapes(term: Term) -> dict[str, tuple[int, ...]]:
    return {t.attrs[0]: parse_shape(t.attrs[1]) for t in postorder([term]) if t.op == "input"}


def sexpr(term: Term) -> str:
    """The term in the rule pattern language, inputs as variables: ``parse`` reads it back."""
    text: dict[int, str] = {}
    for t in postorder([term]):
        if t.op == "input":
            text[id(t)] = "?" + t.attrs[0]
        else:
            parts = [t.op] + [text[id(a)] for a in t.args] + [pat.literal(v) for v in t.attrs]
            text[id(t)] = f"({' '.join(parts)})"
    return text[id(term)]


def from_sexpr(text: str, shapes: dict[str, tuple[int, ...]]) -> Term:
    bindings = {name: Term.input(name, shape, "float64") for name, shape in shapes.items()}
    return pat.instantiate(pat.parse(text), bindings)


def checkable(term: Term, env: dict) -> bool:
    """Rewrites are identities of real arithmetic: an input where the original passes through an
    infinity or NaN on its way to a finite output (expm1(log(0)) = -1) is outside the contract."""
    values: dict = {}
    evaluate([term], env, record=values)
    return all(bool(torch.isfinite(torch.as_tensor(v)).all()) for v in values.values())


#: objectives taken in turn: stability extracts through its own path (re-ranking by estimated error)
OBJECTIVES = (Objective.BALANCED, Objective.STABILITY)


def disagreement(term: Term, ranges: dict | None, env: dict,
                 objective: Objective = Objective.BALANCED) -> str:
    """Why the optimized program disagrees with ``term`` on ``env``; empty when it agrees.

    Agreement is within TOLERANCE of the output's scale plus the original's own float64 rounding
    noise, estimated from its float32 evaluation (scaled by 2^-29): an ill-conditioned program
    (dividing by a value that is itself rounding noise) may differ by that much and no more."""
    program_inputs = tuple(t for t in postorder([term]) if t.op == "input")
    result = optimize(Program(program_inputs, term), rules=select(), input_ranges=ranges,
                      limits=LIMITS, objective=objective)
    (optimized,) = leaves(result.program.outputs)
    before, after = (torch.as_tensor(v) for v in evaluate([term, optimized], env))
    if after.shape != before.shape:
        return f"shape {tuple(after.shape)} != {tuple(before.shape)}; optimized: {pretty(optimized)}"
    finite = torch.isfinite(before)
    if not finite.any():
        return ""
    if not torch.isfinite(after[finite]).all():
        return f"non-finite where the original is finite; optimized: {pretty(optimized)}"
    narrow = {k: v.float() if v.is_floating_point() else v for k, v in env.items()}
    single = torch.as_tensor(evaluate([term], narrow)[0]).double().expand_as(before)
    noise = torch.where(torch.isfinite(single), (single - before).abs(),  # float32 overflowing
                        torch.full_like(before, torch.inf))  # where float64 does not: no yardstick
    scale = max(float(before[finite].abs().max()), 1e-300)
    excess = (after - before).abs() - 10 * 2.0 ** -29 * noise
    error = float(excess[finite].max()) / scale
    return f"error {error:.3g}; optimized: {pretty(optimized)}" if error > TOLERANCE else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    found, crashed, unchecked = [], [], 0
    for seed in range(args.seed * 1_000_000, args.seed * 1_000_000 + args.n):
        term, ranges = program(seed)
        env = inputs(term, ranges, seed)
        if not checkable(term, env):
            unchecked += 1
            continue
        try:
            why = disagreement(term, ranges, env, OBJECTIVES[seed % len(OBJECTIVES)])
        except Exception as e:  # noqa: BLE001 - a crash of the optimizer is a finding too
            crashed.append((seed, term, ranges, f"{type(e).__name__}: {e}"))
            continue
        if why:
            found.append((seed, term, ranges, why))
    seconds = time.perf_counter() - start
    checked = args.n - unchecked - len(crashed)
    print(f"{args.n} programs in {seconds:.0f} s: {checked} checked, {len(found)} disagreed, "
          f"{len(crashed)} crashed the optimizer, {unchecked} skipped (an intermediate of the original not finite)")
    for title, rows in (("DISAGREEMENT", found), ("CRASH", crashed)):
        for seed, term, ranges, why in rows:
            print(f"\n[{title}] seed {seed}, ranges {ranges}, shapes {input_shapes(term)}\n"
                  f"  term:  {pretty(term)}\n  sexpr: {sexpr(term)}\n  {why}")
    return 1 if found or crashed else 0


if __name__ == "__main__":
    sys.exit(main())
