"""Fuzzer: random programs, optimized with every rule that is not unsafe, must never be made wrong.

Two checks. Term programs in float64 on ordinary inputs must agree with the original wherever the
original is finite (same shape, within 1e-9 of the output's scale): rules are identities. And
every program, run in float32, is judged against its float64 truth: it is *made wrong* where the
original's element was right (within RIGHT of the truth, or the truth's own NaN or infinity) and
the optimized one's is not (beyond WRONG, or another non-finite value), and stays so against the
long double truth where there is one (float64 has its own cancellations). Inputs come in classes:
ordinary, extreme (+-inf, +-0, NaN, the dtype's max, subnormals mixed in) and empty (a size-0
axis). One seed in five draws a stateful torch program instead, run through
``saturate_and_extract`` several times: in-place ops on its arguments, or a conv/linear module with
batch norm and dropout switched between train and eval; its outputs, its arguments after the call
and the module's state must not be made wrong either.

Every program comes from its own seed, so a finding is reproduced by ``program(seed)`` (or
``stateful(seed)``) and kept verbatim (its s-expression and seed) in tests/test_fuzz_regressions.py.
Half the Term programs declare input ranges and draw their inputs inside them, so guarded rules
and the range analysis are tried too; y's shape varies so broadcasting and reductions over size-1
axes are tried as well. Tripwires are on: an unsound merge is a crash.

    python bench/fuzz.py --n 2000 [--seed S]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import math
import multiprocessing
import os
import random
import sys
import time
import warnings

import torch
import torch.nn.functional as F

os.environ.setdefault("EGRAPH_OPT_TRIPWIRES", "1")  # before egglog is loaded: unsound merges raise

from egraph_opt import Limits, optimize, pretty, saturate_and_extract
from egraph_opt.lang import pattern as pat
from egraph_opt.extractors import Objective
from egraph_opt.lang.program import Program, leaves
from egraph_opt.rulesets import select
from egraph_opt.lang.ops import parse_shape
from egraph_opt.lang.term import Term, evaluate, postorder
from egraph_opt.validate import wide_reference

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from exact_reals import exact  # noqa: E402 - the mpmath truth the accuracy tests use

TOLERANCE = 1e-9
LIMITS = Limits(max_iterations=15, max_enodes=5_000, max_seconds=2.0)  # keeps one program < ~1 s
X_SHAPE, Y_SHAPES = (3, 4), [(3, 4), (1, 4), (3, 1)]
CONSTS = [0.0, 0.5, 1.0, 2.0, 3.0, -1.0]  # 0 and 1 make the identity rules (add-zero, mul-one) fire
RANGES = [(-3.0, 3.0), (0.1, 10.0), (-1e-3, 1e-3), (1.0, 50.0), (-50.0, -1.0), (0.0, 1.0)]
UNARY = ["exp", "log", "neg", "tanh", "sigmoid", "abs", "sqrt", "log1p", "expm1", "relu", "sin", "cos",
         "tan", "atan", "asinh", "acosh", "atanh", "cbrt", "silu"]
# copysign comes only in spellings whose sign operand is NaN where its magnitude is: a NaN's sign bit is the
# machine's (x86's 0/0 is -NaN, CUDA's +NaN), so copysign(a, 0/0) has no one right answer
BINARY = ["add", "sub", "mul", "div", "maximum", "pow", "atan2", "hypot"]


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
    "signed_asinh": lambda t: op("copysign", op("log", op("add", op("abs", t), op("sqrt", op("add", op("mul", t, t), ONE)))), t),
    "odd_of_abs": lambda t: op("copysign", op("tanh", op("abs", t)), t),
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
    "log_difference": lambda a, b: op("sub", op("log", a), op("log", b)),
    "reciprocal_difference": lambda a, b: op("sub", op("div", ONE, a), op("div", ONE, b)),
    "sqrt_difference": lambda a, b: op("sub", op("sqrt", a), op("sqrt", b)),
    "tan_difference": lambda a, b: op("sub", op("tan", a), op("tan", b)),
    "atan_difference": lambda a, b: op("sub", op("atan", a), op("atan", b)),
    "pair_softmax": lambda a, b: op("div", op("exp", a), op("add", op("exp", a), op("exp", b))),
    "blend_with_one": lambda a, b: op("add", op("sub", ONE, a), op("mul", a, op("exp", b))),
    "hypot_naive": lambda a, b: op("sqrt", op("add", op("mul", a, a), op("mul", b, b))),
}


def program(seed: int, depth: int = 3, shapes: tuple = (X_SHAPE, Y_SHAPES)) -> tuple[Term, dict]:
    """The random program of ``seed``: a term over x and y and its declared input ranges."""
    rng = random.Random(seed)
    x = Term.input("x", shapes[0], "float64")
    y = Term.input("y", rng.choice(shapes[1]), "float64")

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


#: input classes: ordinary values; extremes mixed in; a size-0 axis (x's shape, then y's choices)
CLASSES = ("normal", "extreme", "empty")
EMPTY_SHAPES = [((0, 4), [(0, 4), (1, 4)]), ((3, 0), [(3, 0), (3, 1)])]
_F32 = torch.finfo(torch.float32)
SPECIALS = [math.inf, -math.inf, math.nan, 0.0, -0.0, _F32.max, -_F32.max, _F32.smallest_normal,
            _F32.smallest_normal * 2 ** -10, -_F32.smallest_normal * 2 ** -20, 88.7, -103.0, 1.0]
EXTREME_SHARE = 0.3  # of an extreme input's elements


def input_class(seed: int) -> str:
    return random.Random(f"class-{seed}").choices(CLASSES, weights=(5, 4, 1))[0]


def drawn(seed: int) -> tuple[Term, dict | None, str]:
    """The program of ``seed``, its declared ranges and its input class."""
    kind = input_class(seed)
    shapes = random.Random(f"empty-{seed}").choice(EMPTY_SHAPES) if kind == "empty" else (X_SHAPE, Y_SHAPES)
    return (*program(seed, shapes=shapes), kind)


def inputs(term: Term, ranges: dict | None, seed: int, kind: str = "normal") -> dict[str, torch.Tensor]:
    """float64 values for the term's inputs: inside declared ranges (endpoints included), else
    standard normal; ``extreme``: a share of the elements replaced by SPECIALS (those inside the
    declared range, if any)."""
    gen = torch.Generator().manual_seed(seed)
    env = {}
    for name, shape in input_shapes(term).items():
        lo, hi = ranges[name] if ranges and name in ranges else (-math.inf, math.inf)
        if ranges and name in ranges:
            value = lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)
            value.view(-1)[:2] = torch.tensor([lo, hi], dtype=torch.float64)[:value.numel()]
        else:
            value = torch.randn(shape, generator=gen, dtype=torch.float64)
        if kind == "extreme":
            value = with_specials(value, lo, hi, gen)
        env[name] = value
    return env


def with_specials(value: torch.Tensor, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    allowed = torch.tensor([v for v in SPECIALS if lo <= v <= hi or (math.isnan(v) and lo == -math.inf)],
                           dtype=torch.float64)
    if not allowed.numel():
        return value
    pick = allowed[torch.randint(len(allowed), value.shape, generator=gen)]
    return torch.where(torch.rand(value.shape, generator=gen) < EXTREME_SHARE, pick.to(value.dtype), value)


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


def from_sexpr(text: str, shapes: dict[str, tuple[int, ...]], dtype: str = "float64") -> Term:
    bindings = {name: Term.input(name, shape, dtype) for name, shape in shapes.items()}
    return pat.instantiate(pat.parse(text), bindings)


def checkable(term: Term, env: dict) -> bool:
    """Rewrites are identities of real arithmetic: an input where the original passes through an
    infinity or NaN on its way to a finite output (expm1(log(0)) = -1) is outside the contract."""
    values: dict = {}
    evaluate([term], env, record=values)
    return all(bool(torch.isfinite(torch.as_tensor(v)).all()) for v in values.values())


def optimized_term(term: Term, ranges: dict | None, objective: Objective) -> Term:
    program_inputs = tuple(t for t in postorder([term]) if t.op == "input")
    result = optimize(Program(program_inputs, term), rules=select(), input_ranges=ranges,
                      limits=LIMITS, objective=objective)
    (optimized,) = leaves(result.program.outputs)
    return optimized


#: objectives taken in turn: stability extracts through its own path (re-ranking by estimated error)
OBJECTIVES = (Objective.BALANCED, Objective.STABILITY)


def long_double_truth(term: Term, env: dict) -> list | None:
    """The term's outputs in long double (``wide_reference``), where every op has a form there."""
    inputs = tuple({id(t): t for t in postorder([term]) if t.op == "input"}.values())
    return wide_reference(Program(inputs, term), tuple(env[t.attrs[0]] for t in inputs))


def disagreement(term: Term, ranges: dict | None, env: dict,
                 objective: Objective = Objective.BALANCED) -> str:
    """Why the optimized program disagrees with ``term`` on ``env``; empty when it agrees.

    Agreement is within TOLERANCE of the output's scale plus the original's own float64 rounding
    noise, estimated from its float32 evaluation (scaled by 2^-29): an ill-conditioned program
    (dividing by a value that is itself rounding noise) may differ by that much and no more."""
    optimized = optimized_term(term, ranges, objective)
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
    if error > TOLERANCE:  # float64 cancels too (1 - cos(u) at u = 1e-6 is 1e-4 off): the long
        # double truth, where there is one, judges both; the optimized no farther from it
        wide = long_double_truth(term, env)
        if wide is not None:
            truth = torch.as_tensor(wide[0]).expand_as(before)
            own = (before - truth).abs()
            error = float(((after - truth).abs() - own)[finite].max()) / scale
    return f"error {error:.3g}; optimized: {pretty(optimized)}" if error > TOLERANCE else ""


RIGHT, WRONG = 1e-5, 1e-3  # relative error of a float32 element: right within, wrong beyond


def within(value, truth: torch.Tensor, tolerance: float) -> torch.Tensor:
    """Elementwise: ``value`` is the truth's own NaN or infinity, or both are finite and within
    ``tolerance`` of |truth| + 2^-20 of the output's scale. Integers (counters) must be equal."""
    value = torch.as_tensor(value).expand_as(truth)
    if not truth.is_floating_point():
        return value == truth
    truth, value = truth.double(), value.double()
    finite = truth.isfinite()
    scale = float(truth[finite].abs().max()) if finite.any() else 0.0
    floor = 2.0 ** -20 * scale + _F32.smallest_normal
    close = finite & value.isfinite() & ((value - truth).abs() <= tolerance * (truth.abs() + floor))
    return close | (value.isnan() & truth.isnan()) | (~finite & (value == truth))


def new_infinities(value, operands) -> bool:
    """Whether an op made an infinity of finite operands (elementwise where shapes allow; a
    reduction or matmul: where no operand element was infinite)."""
    value = torch.as_tensor(value)
    fresh = value.isinf()
    for a in operands:
        known = torch.as_tensor(a).isinf()
        try:
            fresh = fresh & ~torch.broadcast_to(known, value.shape)
        except RuntimeError:
            fresh = fresh & ~known.any()
    return bool(fresh.any())


def overflowed(term: Term, env: dict) -> torch.Tensor | None:
    """Where the float64 truth itself overflowed: an op made an infinity of finite operands
    (exp(800), 1 / 0), and every element of the result that infinity reached, finite or not (exp(v)
    / sum at a row holding v = 3.4e38 is NaN there and 0 beside it, where the real log_softmax is
    -3.4e38): float64's, no truth to hold others to. Found by evaluating again with each such
    infinity made NaN ((t - t) + t: finite values unchanged), which every op carries on; None
    where nothing overflowed."""
    values: dict = {}
    evaluate([term], env, reference=True, record=values)
    made = {id(t) for t in postorder([term])
            if t.args and new_infinities(values[id(t)], [values[id(a)] for a in t.args])}
    if not made:
        return None
    marked: dict[int, Term] = {}
    for t in postorder([term]):
        u = Term(t.op, tuple(marked[id(a)] for a in t.args), t.attrs) if t.args else t
        marked[id(t)] = Term("add", (Term("sub", (u, u)), u)) if id(t) in made else u
    (reached,) = evaluate([marked[id(term)]], env, reference=True)
    truth = torch.as_tensor(values[id(term)])
    return ~truth.isfinite() | (torch.as_tensor(reached).isnan() & ~truth.isnan())


class Overflows(torch.overrides.TorchFunctionMode):
    """``overflowed`` for a torch function: records whether any op it runs made an infinity of
    finite operands."""
    seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            operands = [a for a in torch.utils._pytree.tree_leaves((args, kwargs))
                        if isinstance(a, torch.Tensor)]
            self.seen = self.seen or new_infinities(out.detach(), [a.detach() for a in operands])
        return out


#: a finding whose every element was NaN in the original and its truth and is not now
#: (sigmoid(inf) = 1 where exp(y) / (1 + exp(y)) is inf / inf): made wrong by the letter (NaN where
#: NaN), the limit in fact; counted apart where no input holds a NaN
LIMIT = "an indeterminate form's NaN became a number: "


def wrong_where_right(original, optimized, truth, ignore=None) -> str:
    """Why ``optimized`` is made wrong where ``original`` was right; empty when it is not."""
    truth, original, optimized = (torch.as_tensor(v).detach() for v in (truth, original, optimized))
    if optimized.shape != original.shape:
        return f"shape {tuple(optimized.shape)} != {tuple(original.shape)}"
    truth = truth.expand(original.shape)
    bad = within(original, truth, RIGHT) & ~within(optimized, truth, WRONG)
    if ignore is not None:
        bad &= ~ignore.expand(original.shape)
    if not bad.any():
        return ""
    limit = bool((original.isnan() & truth.isnan() & ~optimized.isnan())[bad].all())
    i = int(bad.reshape(-1).nonzero()[0])
    flat = lambda v: torch.as_tensor(v).expand(original.shape).reshape(-1)[i].item()  # noqa: E731
    return (LIMIT * limit + f"{int(bad.sum())} of {bad.numel()} elements made wrong, e.g. truth {flat(truth):.6g}, "
            f"original {flat(original):.6g}, optimized {flat(optimized):.6g}")


def made_wrong(term: Term, ranges: dict | None, env: dict, objective: Objective = Objective.BALANCED) -> str:
    """The term run in float32, optimized and not, against its float64 truth: why the optimized
    program is wrong where the original was right; empty when it is not."""
    low = from_sexpr(sexpr(term), input_shapes(term), "float32")
    optimized = optimized_term(low, ranges, objective)
    env32 = {k: v.float() for k, v in env.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # var() of none and the like warn as the original does
        try:
            (truth,) = evaluate([low], env32, reference=True)
        except IndexError:  # torch refuses the program itself (amax over a size-0 axis): no truth
            return ""
        before, after = evaluate([low, optimized], env32)
    ignore = overflowed(low, env32)
    why = wrong_where_right(before, after, truth, ignore)
    if why:  # float64 rounds too: 1 - cos(u) is 0 there at u = 1e-9, where 2 sin(u/2)^2 is right
        wide = long_double_truth(low, env32)
        if wide is not None and not wrong_where_right(before, after, torch.as_tensor(wide[0]), ignore):
            return ""
        if not wrong_where_right(before, after, truth, _conditioned(low, env32, after, truth, ignore)):
            return ""
        real = exact(low, env32)  # long double cancels too: (1 + y) - y at y = 3e38 (the real value, rounded once)
        if real is not None and not wrong_where_right(before, after, real, ignore):
            return ""
    if why and any(bool((v.abs() < 1e-12).any()) for v in env32.values() if v.is_floating_point()):
        (toward,) = evaluate([low], nudged_zeros(env32), reference=True)
        explained = within(after, torch.as_tensor(toward), WRONG)
        if not wrong_where_right(before, after, truth, explained if ignore is None else ignore | explained):
            why = ZERO_LIMIT + why
    if why.startswith(LIMIT) and any(bool(v.isinf().any()) for v in env32.values() if v.is_floating_point()):
        far = {k: v.double().nan_to_num(math.nan, 1e300, -1e300) if v.is_floating_point() else v
               for k, v in env32.items()}
        (toward,) = evaluate([low], far, reference=True)  # each infinite input moved to +-1e300
        explained = within(after, torch.as_tensor(toward), WRONG)
        if not wrong_where_right(before, after, truth, explained if ignore is None else ignore | explained):
            why = INF_LIMIT + why
    return f"{why}; optimized: {pretty(optimized)}" if why else ""


def _conditioned(low: Term, env32: dict, after, truth: torch.Tensor, ignore):
    """Elements whose truth two ulps of every input move by more than a quarter of the optimized result's error:
    their digits are the inputs' last bits, not the rewrite's (log(v) at v one ulp from 1: any float32 program that
    rounds v once is 0 or +-6e-8 there, against a truth of 3e-16)."""
    moved = {k: v.double() * (1 + 2 * _F32.eps) if v.is_floating_point() else v for k, v in env32.items()}
    (toward,) = evaluate([low], moved, reference=True)
    error = (torch.as_tensor(after).double() - truth.double()).abs()
    explained = (error <= 4 * (torch.as_tensor(toward).double() - truth.double()).abs()).expand(truth.shape)
    return explained if ignore is None else ignore | explained


#: a finding whose every element is the truth at the infinite inputs moved to +-1e300: a NaN
#: input at another element does not make sigmoid(inf) = 1 a wrong answer; counted apart
INF_LIMIT = "an infinite input's limit replaced an indeterminate form: "


#: a finding whose every element is the truth at the zero (or subnormal) inputs moved off zero toward
#: their signs: log1p(-0) is -0 where log(1 + -0) is +0, the sign log(1 + x) has at every x < 0 (the
#: rules' extremes test admits that sign, tests/test_rule_extremes.py limit_sign); counted apart
ZERO_LIMIT = "a signed zero's limit replaced its float64 value: "


def nudged_zeros(env: dict) -> dict:
    """The inputs in float64, each zero or tinier value (a subnormal) moved to 1e-12 with its sign
    (1 + 1e-12 is not 1 in float64: a smaller step vanishes where it meets a one, as -1e-44 does in
    log(1 + y), whose float64 value 0 is not the sign the real log has there)."""
    def nudge(v):
        if not v.is_floating_point():
            return v
        v = v.double()
        return torch.where(v.abs() < 1e-12, torch.where(v.signbit(), -1e-12, 1e-12), v)
    return {k: nudge(v) for k, v in env.items()}


# Stateful programs: torch functions that write into their arguments, modules with state.
BODIES = {  # a pure body f of the in-place templates
    "exp": torch.exp, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "square": lambda v: v * v,
    "log1p-abs": lambda v: torch.log(1 + v.abs()),
    "naive-softmax": lambda v: torch.exp(v) / torch.exp(v).sum(-1, keepdim=True),
}
#: a body's truth where float64 cancels as float32 does: log(1 + |v|) loses |v| below 2^-53 (seed 4601000159: the
#: optimized log1p's -3.8e-6 at v = -1.1e-44, y = -3.4e38 was judged against float64's 0)
TRUTHS = {"log1p-abs": lambda v: torch.log1p(v.abs())}


def in_place(template: str, f, c: float):
    """The function ``template`` names, over the body f and a constant c."""
    def add_then_use(x, y):
        x.add_(c)
        return f(x) + y

    def use_then_mul(x, y):
        h = f(x) * y
        x.mul_(c)
        return h + x

    def set_row(x, y):
        x[0] = c
        return f(x) * y

    def through_a_view(x, y):
        x.view(-1).add_(c)
        return f(x) - y

    def clamp_other(x, y):
        y.clamp_(min=c)
        return f(x) + y

    def fresh_relu_in_place(x, y):  # pure: the intermediate is read once
        return F.relu(f(x) - c, inplace=True) * y

    def augmented(x, y):
        x += y
        return f(x)
    return locals()[template.replace("-", "_")]


TEMPLATES = ["add-then-use", "use-then-mul", "set-row", "through-a-view", "clamp-other",
             "fresh-relu-in-place", "augmented"]


def module(spec: dict) -> torch.nn.Module:
    torch.manual_seed(spec["init"])
    linear = spec["layer"] == "linear"
    layers = [torch.nn.Linear(4, 6) if linear else torch.nn.Conv2d(2, 3, 3)]
    if spec["norm"]:
        layers.append(torch.nn.BatchNorm1d(6) if linear else torch.nn.BatchNorm2d(3))
    layers.append({"relu": torch.nn.ReLU(inplace=True), "gelu": torch.nn.GELU(), "tanh": torch.nn.Tanh()}[spec["act"]])
    if spec["dropout"]:
        layers.append(torch.nn.Dropout(spec["dropout"]))
    return torch.nn.Sequential(*layers)


def stateful(seed: int) -> dict:
    """The stateful program of ``seed``, as data: an in-place template or a module spec, the
    training flag of each call, the input class."""
    rng = random.Random(f"stateful-{seed}")
    kind = rng.choice(["normal", "extreme"])
    if rng.random() < 0.5:
        return {"template": rng.choice(TEMPLATES), "body": rng.choice(list(BODIES)),
                "c": rng.choice(CONSTS), "calls": [False] * 2, "class": kind}
    return {"layer": rng.choice(["linear", "conv"]), "norm": rng.random() < 0.7,
            "act": rng.choice(["relu", "gelu", "tanh"]), "dropout": rng.choice([0.0, 0.0, 0.5]),
            "init": seed, "calls": [rng.random() < 0.5 for _ in range(3)], "class": kind}


def stateful_wrong(seed: int, objective: Objective = Objective.BALANCED) -> str:
    """Calls of the stateful program of ``seed`` optimized and not, on the same inputs: why an
    output, an argument after the call, or the module's state is made wrong; empty if none is."""
    spec = stateful(seed)
    gen = torch.Generator().manual_seed(seed)
    if "template" in spec:
        fn = reference = in_place(spec["template"], BODIES[spec["body"]], spec["c"])
        exact = in_place(spec["template"], TRUTHS.get(spec["body"], BODIES[spec["body"]]), spec["c"])
        shapes = [(3, 4), (3, 4)]
    else:
        fn, reference = module(spec), module(spec)
        shapes = [(5, 4) if spec["layer"] == "linear" else (2, 2, 5, 5)]
    optimized = saturate_and_extract(fn, objective=objective, limits=LIMITS, profile_db=False)
    for call, training in enumerate(spec["calls"]):
        args = [torch.randn(s, generator=gen) for s in shapes]
        if spec["class"] == "extreme":
            args = [with_specials(a, -math.inf, math.inf, gen) for a in args]
        truth = exact if "template" in spec else reference
        if isinstance(fn, torch.nn.Module):
            fn.train(training), reference.train(training)
            truth = copy.deepcopy(reference).double()
        overflow = Overflows()  # watches the truth's run
        runs = {}  # name: output, arguments after the call, module state after the call
        for name, run, holder, dtype in (("truth", truth, truth, torch.float64),
                                         ("original", reference, reference, None),
                                         ("optimized", optimized, fn, None)):
            given = [a.to(dtype) if dtype else a.clone() for a in args]
            torch.manual_seed(call)
            with warnings.catch_warnings(), overflow if name == "truth" else contextlib.nullcontext():
                warnings.simplefilter("ignore")  # a plan that falls back warns
                out = run(*given)
            state = list(holder.state_dict().values()) if isinstance(holder, torch.nn.Module) else []
            runs[name] = [out, *given, *state]
        masked = None
        if spec.get("dropout") and training:  # masks differ between runs (and inf * 0 is NaN):
            outs = torch.stack([runs[k][0].detach() for k in ("original", "optimized")])
            masked = ~(outs.isfinite() & (outs != 0)).all(0)  # only elements both kept are compared
        if overflow.seen:  # float64's own infinities are no truth (as in made_wrong)
            unknown = ~runs["truth"][0].isfinite()
            masked = unknown if masked is None else masked | unknown
        for i, (t, o, p) in enumerate(zip(runs["truth"], runs["original"], runs["optimized"])):
            why = wrong_where_right(o, p, t, masked if i == 0 else None)
            if why:
                what = "output" if i == 0 else f"argument {i - 1}" if i <= len(args) else f"state {i - 1 - len(args)}"
                return (f"call {call} (training={training}): {what}: {why}; "
                        f"fallback: {optimized.report.fallback or 'none (optimized)'}")
    return ""


def check(seed: int) -> tuple[str, str, str] | None:
    """The finding of ``seed`` as (kind, description, why): kind is "wrong", "limit", "disagreed",
    "crashed" or "unchecked" (its float64 agreement not checkable); None when nothing is found."""
    objective = OBJECTIVES[seed % len(OBJECTIVES)]
    if seed % 5 == 4:
        title = f"stateful {stateful(seed)}"
        try:
            why = stateful_wrong(seed, objective)
        except Exception as e:  # noqa: BLE001 - a crash of the optimizer is a finding too
            return "crashed", title, f"{type(e).__name__}: {e}"
        return ("wrong", title, why) if why else None
    term, ranges, kind = drawn(seed)
    return finding(term, ranges, kind, seed, objective)


def finding(term: Term, ranges: dict | None, kind: str, seed: int, objective: Objective):
    """What ``check`` finds in one program, its inputs drawn from ``seed``: regression tests name a program, as
    growing the generator's vocabulary draws other programs from the same seeds."""
    env = inputs(term, ranges, seed, kind)
    title = (f"{kind} inputs, ranges {ranges}, shapes {input_shapes(term)}\n  term:  {pretty(term)}\n"
             f"  sexpr: {sexpr(term)}")
    try:
        why = made_wrong(term, ranges, env, objective)
        if why:
            nan_free = not any(v.isnan().any() for v in env.values())
            limit = why.startswith(LIMIT) and nan_free or why.startswith((ZERO_LIMIT, INF_LIMIT))
            return ("limit" if limit else "wrong"), title, why
        if kind != "normal":
            return None
        if not checkable(term, env):
            return "unchecked", title, ""
        why = disagreement(term, ranges, env, objective)
    except Exception as e:  # noqa: BLE001 - a crash of the optimizer is a finding too
        return "crashed", title, f"{type(e).__name__}: {e}"
    return ("disagreed", title, why) if why else None


HEADINGS = {"wrong": "MADE WRONG", "limit": "LIMIT", "disagreed": "DISAGREEMENT", "crashed": "CRASH"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    args = parser.parse_args()
    start = time.perf_counter()
    seeds = range(args.seed * 1_000_000, args.seed * 1_000_000 + args.n)
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:  # fork hangs (egglog threads)
        results = [(seed, r) for seed, r in zip(seeds, pool.imap(check, seeds, chunksize=4)) if r]
    rows = {kind: [(seed, title, why) for seed, (k, title, why) in results if k == kind]
            for kind in (*HEADINGS, "unchecked")}
    seconds = time.perf_counter() - start
    print(f"{args.n} programs in {seconds:.0f} s ({args.jobs} processes): "
          f"{len(rows['wrong']) + len(rows['limit'])} made wrong where the original was right "
          f"(float32 against a float64 truth; {args.n // 5} of them stateful), {len(rows['limit'])} of "
          f"them only where a limit replaced the float64 value (of an indeterminate form of infinite "
          f"inputs, or at a signed zero); "
          f"{len(rows['crashed'])} crashed the optimizer; float64 agreement of ordinary ones: "
          f"{len(rows['disagreed'])} disagreed, {len(rows['unchecked'])} not checked (an intermediate "
          "of the original not finite)")
    for kind, heading in HEADINGS.items():
        for seed, title, why in rows[kind]:
            print(f"\n[{heading}] seed {seed}, {title}\n  {why}")
    return 1 if any(rows[kind] for kind in HEADINGS) else 0


if __name__ == "__main__":
    sys.exit(main())
