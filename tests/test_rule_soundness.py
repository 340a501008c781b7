"""Proof obligations generated from the rule catalogue, never written per rule.

- sympy: rules over elementwise scalar ops are identities over the reals;
- float64: both sides agree on random tensors wherever the left side is finite (definedness: the
  right side must be finite there too);
- purpose: each stability rule, at some extreme input in float32, keeps accuracy where its left side
  loses it.
"""
import itertools
import math
import operator

import pytest
import sympy
from sympy.calculus.util import minimum
import torch

from egraph_opt.kernels.torch_ops import TORCH
from egraph_opt.lang import pattern as pat
from egraph_opt.egraph.engine import EGraph
from egraph_opt.rulesets import Exactness, Family, catalogue
from egraph_opt.lang.mesh import Local, through_reshape
from egraph_opt.lang.ops import parse_shape, shape_attr
from egraph_opt.lang.term import Term, evaluate
from exact_reals import exact

RULES = [r for r in catalogue().values() if r.exactness is not Exactness.UNSAFE]  # quarantined
# rules are checked against their counterexamples instead (test_rule_catalogue.py)
SHAPE = (2, 3, 5, 5)  # every tensor variable: square trailing dims fit matmul and attention
TOLERANCE = {Exactness.EXACT: 1e-9, Exactness.REASSOC: 1e-9, Exactness.APPROX: 1e-3}
_SIGNS = {"positive": 1, "nonneg": 1, "nonzero": 0, "negative": -1}  # sampled magnitude >= 0.1;
# the sign drawn: 1 positive, -1 negative, 0 either


def _sexp(fact) -> list:
    """A guard fact as nested lists of tokens: read here apart from the guard module's evaluator."""
    return pat.sexp(str(fact))


def _sampled_bound(x: torch.Tensor, head: str) -> float:
    """``lo``/``hi`` of a sampled tensor: its own least and greatest element."""
    return float(x.min() if head == "lo" else x.max())


def _value(e, values: dict, env: dict, bound=_sampled_bound):
    """Evaluate a condition over sampled bindings: primitives on attributes, and the e-graph's
    analyses on the sampled tensors (``bound`` gives ``lo``/``hi``; elementwise for the extremes
    test, so a fact may hold at some elements only)."""
    if isinstance(e, str):
        if e.startswith("?"):
            return values[e[1:]]
        return float(e) if e[0].isdigit() or e[0] in "-." else e.strip('"')
    head, *args = e
    if head in ("rank", "last-dim"):
        shape = tuple(env[args[0][1:]].shape)
        return len(shape) if head == "rank" else shape[-1]
    if head == "axis-size":  # no such axis: no fact, so the guard cannot hold (NaN equals nothing)
        shape, axis = tuple(env[args[0][1:]].shape), _value(args[1], values, env, bound)
        return shape[int(axis)] if -len(shape) <= axis < 0 else float("nan")  # a literal axis reads as float
    if head in ("reshape-axis", "reshape-part"):  # what the loaded program's shapes give
        shape, target, axis = (tuple(env[args[0][1:]].shape), *(_value(a, values, env, bound) for a in args[1:]))
        kept = through_reshape(shape, parse_shape(target)).get(axis)
        return float("nan") if kept is None else kept[head == "reshape-part"]
    if head == "whole":  # every device holds it whole: a sampled tensor is the same on each
        return not isinstance(env.get(args[0][1:]), Local)
    if head in ("lo", "hi"):  # the range analysis' bounds
        return bound(env[args[0][1:]], head)
    if head == "dtype-of":
        return None  # casts are exact in the float64 reference: dtype conditions hold vacuously
    vals = [_value(a, values, env, bound) for a in args]
    if head == "=" and None in vals:
        return True
    return {"=": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt,
            "<=": operator.le, ">=": operator.ge, "-": operator.sub, "+": operator.add,
            "*": operator.mul, "/": operator.truediv, "abs": abs, "to-string": str,
            "min": lambda a, b: torch.minimum(torch.as_tensor(a), torch.as_tensor(b)),
            "max": lambda a, b: torch.maximum(torch.as_tensor(a), torch.as_tensor(b))}[head](*vals)


def _uses(p, op: str, position: int) -> set[str]:
    """Variables in operand ``position`` of ``op`` nodes (indices of gather, where's condition)."""
    found, stack = set(), [p]
    while stack:
        q = stack.pop()
        if isinstance(q, pat.Node):
            if q.op == op and isinstance(q.args[position], pat.Var):
                found.add(q.args[position].name)
            stack.extend(q.args)
    return found


#: operands that hold integer indices: gathered positions, class targets (with what builds them)
INDEX_OPERANDS = (("gather", 1), ("index_select", 1), ("nll_loss", 1), ("cross_entropy", 1))


def _index_vars(p) -> set[str]:
    """Tensor variables an op reads as indices, anywhere inside such an operand (t[:, None])."""
    found, stack = set(), [p]
    while stack:
        q = stack.pop()
        if isinstance(q, pat.Node):
            stack.extend(q.args)
            for op, i in INDEX_OPERANDS:
                if q.op == op:
                    found |= {v for v, s in pat.variables(q.args[i]).items() if s == pat.TENSOR}
    return found


def _params(p) -> list[pat.Node]:
    found, stack = [], [p]
    while stack:
        q = stack.pop()
        if isinstance(q, pat.Node):
            if q.op == "param":
                found.append(q)
            stack.extend(q.args)
    return found


def bind(rule, gen: torch.Generator, dtype=torch.float64, scale=2.0) -> tuple[dict, dict]:
    """Random bindings satisfying the rule's conditions: tensors by name and attribute values.
    ``rule.sample`` pins shapes (tensor variables, param shape strings), attribute values and a
    tensor variable's magnitude (a float: a guard that asks for a/b past a dtype's max needs it)."""
    lhs = pat.Node("add", tuple(left for left, _ in rule.pairs()), ())  # every root, one walk
    sorts = {v: s for left, _ in rule.pairs() for v, s in pat.variables(left).items()}
    sorts.update(rule.bound())
    pinned = dict(rule.sample)
    signs = {f.strip("()").split()[1][1:]: f.strip("()").split()[0]
             for f in map(str, rule.when) if f.strip("()").split()[0] in _SIGNS}
    indices = _index_vars(lhs)
    conditions = _uses(lhs, "where", 0) | _uses(lhs, "sdpa_filled", 3)  # boolean operands
    param_vars = {q.attrs[0].name: q.attrs for q in _params(lhs)}
    for attempt in range(100):
        values, env = {}, {}
        for name, attrs in param_vars.items():
            shape = parse_shape(pinned.get(attrs[1].name, shape_attr(SHAPE)))
            values[name], values[attrs[1].name], values[attrs[2].name] = f"p_{name}", shape_attr(shape), "float64"
            env[f"p_{name}"] = torch.randn(shape, generator=gen, dtype=dtype).abs() + 0.1
        for name, sort in sorts.items():
            if name in values:
                continue
            if sort == pat.TENSOR:
                pin = pinned.get(name, SHAPE)
                shape, magnitude = (SHAPE, pin) if isinstance(pin, float) else (pin, scale)
                if name in indices:
                    x = torch.randint(0, shape[-1], shape, generator=gen)
                elif name in conditions:
                    x = torch.rand(shape, generator=gen) < 0.3
                else:
                    x = torch.randn(shape, generator=gen, dtype=dtype) * magnitude * 0.97 ** attempt
                    if name in signs:
                        x = x.abs() + 0.05 * magnitude
                        sign = _SIGNS[signs[name]]
                        x = x * sign if sign else x * torch.randn(shape, generator=gen).sign()
                env[name] = x
                values[name] = Term.input(name, shape, str(x.dtype).removeprefix("torch."))
            elif name in pinned:
                values[name] = pinned[name]
            elif sort == "i64":
                values[name] = int(torch.randint(-2, 0, (), generator=gen))  # an axis
            elif sort == "bool":
                values[name] = bool(torch.randint(0, 2, (), generator=gen))
            elif sort == "f64":
                values[name] = float(torch.empty(()).uniform_(-3, 3, generator=gen))
            else:
                raise AssertionError(f"{rule.name}: no sampler for ?{name} ({sort}); pin it")
        facts = [f for f in map(str, rule.when)  # facts about the roots bind sizes, which sample pins
                 if f.strip("()").split()[0] not in _SIGNS and "__lhs" not in f]
        if all(_value(_sexp(f), values, env) for f in facts):
            return values, env
    raise AssertionError(f"{rule.name}: could not satisfy {rule.when}")


def on_devices(*values):
    """Values where one is spread over a mesh (``lang/mesh.py``): every device's shape and part
    in a row, a value every device holds whole repeated for each."""
    n = {len(v.parts) for v in values if isinstance(v, Local)}
    if not n:
        return values
    return [_flat(v if isinstance(v, Local) else Local((v,) * max(n))) for v in values]


def _flat(value: Local) -> torch.Tensor:
    """Every device's shape then its part's elements, in one vector: two Locals are equal iff
    these are (parts may differ in size: a split of 5 rows over 2 devices is 3 and 2)."""
    parts = [torch.as_tensor(p) for p in value.parts]
    dtype = parts[0].dtype if parts[0].is_floating_point() else torch.float64
    return torch.cat([torch.cat([torch.tensor(p.shape, dtype=dtype), p.flatten().to(dtype)]) for p in parts])


def sides(rule, values):
    return pat.instantiate(rule.lhs_pattern, values), pat.instantiate(rule.rhs_pattern, values)


def all_sides(rule, values) -> list:
    """Left and right of every root of the rule (several for horizontal fusions)."""
    return [(pat.instantiate(lhs, values), pat.instantiate(rhs, values)) for lhs, rhs in rule.pairs()]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_both_sides_agree_in_float64(rule):
    gen = torch.Generator().manual_seed(7)
    for _ in range(5):
        values, env = bind(rule, gen)
        for left, right in all_sides(rule, values):
            lhs, rhs = on_devices(*evaluate([left, right], env, reference=True))
            lhs, rhs = torch.broadcast_tensors(torch.as_tensor(lhs), torch.as_tensor(rhs))
            defined = torch.isfinite(lhs)
            assert torch.isfinite(rhs[defined]).all(), f"{rule.name}: right undefined where left is not"
            torch.testing.assert_close(rhs[defined], lhs[defined], rtol=TOLERANCE[rule.exactness],
                                       atol=TOLERANCE[rule.exactness])


SYMPY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
         "pow": operator.pow, "neg": operator.neg, "exp": sympy.exp, "log": sympy.log,
         "log1p": lambda x: sympy.log(1 + x), "expm1": lambda x: sympy.exp(x) - 1,
         "sqrt": sympy.sqrt, "rsqrt": lambda x: 1 / sympy.sqrt(x), "abs": sympy.Abs,
         "sin": sympy.sin, "cos": sympy.cos, "tanh": sympy.tanh,
         "sigmoid": lambda x: 1 / (1 + sympy.exp(-x)), "erf": sympy.erf, "tan": sympy.tan,
         "atan": sympy.atan, "hypot": lambda x, y: sympy.sqrt(x * x + y * y),
         "asinh": lambda x: sympy.log(x + sympy.sqrt(x * x + 1)),  # by their real logarithms
         "atanh": lambda x: (sympy.log(1 + x) - sympy.log(1 - x)) / 2, "sinh": sympy.sinh,
         "cbrt": lambda x: sympy.sign(x) * sympy.cbrt(sympy.Abs(x)), "copysign": lambda x, y: sympy.Abs(x) * sympy.sign(y)}


def to_sympy(p, symbols):
    if isinstance(p, pat.Var):
        return symbols.setdefault(p.name, sympy.Symbol(p.name, real=True))
    if isinstance(p, pat.Lit):
        return sympy.nsimplify(p.value)
    if isinstance(p, pat.Prim):
        return pat.ARITHMETIC[p.fn](*(to_sympy(a, symbols) for a in p.args))
    if p.op == "const":
        return to_sympy(p.attrs[0], symbols)
    return SYMPY[p.op](*(to_sympy(a, symbols) for a in p.args))


def scalar(p) -> bool:
    return not isinstance(p, pat.Node) or (
        (p.op in SYMPY or p.op == "const") and all(scalar(a) for a in p.args))


SCALAR_RULES = [r for r in RULES if scalar(r.lhs_pattern) and scalar(r.rhs_pattern)
                and r.exactness is not Exactness.APPROX]  # approximations: tests/test_series.py


POSITIVE = sympy.Interval.Lopen(0, sympy.oo)


def test_scalar_rules_are_found():
    assert {"log-exp-cancel", "log1p-from-log", "div-const-to-mul"} <= {r.name for r in SCALAR_RULES}


@pytest.mark.parametrize("rule", SCALAR_RULES, ids=lambda r: r.name)
def test_scalar_rules_are_identities_over_the_reals(rule):
    symbols: dict = {}
    lhs, rhs = to_sympy(rule.lhs_pattern, symbols), to_sympy(rule.rhs_pattern, symbols)
    # a log's argument over one denominator first: log(1 + c/x) expands as log(x + c) - log(x)
    difference = (lhs - rhs).replace(lambda e: isinstance(e, sympy.log),
                                     lambda e: sympy.log(sympy.together(e.args[0])))
    # a sign or an absolute value: proved on each sign of each variable (x = p and x = -p, p > 0)
    signed = difference.has(sympy.sign, sympy.Abs)
    positive = {v: sympy.Symbol(v.name, positive=True) for v in symbols.values()}
    for signs in itertools.product((1, -1), repeat=len(positive)) if signed else [None]:
        case = difference.subs({v: s * p for (v, p), s in zip(positive.items(), signs)}) if signs else difference
        if signs and len(positive) == 1:  # |e| is e where e's least value over p > 0 is >= 0 (asinh's log)
            (p,) = positive.values()
            case = case.replace(lambda e: isinstance(e, sympy.Abs) and minimum(e.args[0], p, POSITIVE) >= 0,
                                lambda e: e.args[0])
        case = sympy.expand_log(case, force=True).rewrite(sympy.exp)  # or exp of it, 1: asinh(-p) + asinh(p)
        assert sympy.simplify(case) == 0 or signs and sympy.simplify(sympy.exp(case)) == 1, signs


PROBES = {  # extreme inputs, as f(position of the variable, value)
    "large": lambda i, x: x * 300, "offset": lambda i, x: x + 1e6, "tiny": lambda i, x: x * 1e-9,
    "huge": lambda i, x: x * 1e25, "spread": lambda i, x: x * (1e25 if i == 0 else 1e-25),
    "opposed": lambda i, x: x + (100 if i == 0 else -100),
    "cancelling": lambda i, x: x + 1e8 * _alternating(x),
    "close": lambda i, x: 1.0 + x.abs() * 1e-6,  # every variable within 3e-6 of 1, of each other
    "top": lambda i, x: x / x.abs().max() * torch.finfo(torch.float32).max,  # reaching float32's max
    "tail": lambda i, x: x + (30 if i == 0 else 0),  # e^-30 is normal in float32, where 1 - (1 - e^-30) is 0
    "quarter turn": lambda i, x: x * 1e-6 + math.pi / 2,  # sin rounds to 1 (1 - sin^2 x is 0, cos^2 x is not)
    # one operand dominating the rest with one sign (hypot(x, y) -+ x cancels for +-x >> |y|; -b + sqrt(b^2 - q)
    # for b >> |q|), each operand in turn: a draw's values alone need not land where the rule cancels (the quadratic
    # rules' draws showed their purpose on AMD's CPUs, not on an AVX-512 Xeon's)
    **{f"dominant {k}": lambda i, x, k=k: x.abs() * 1e4 + 1 if i == k else x for k in range(3)},
    **{f"dominant negative {k}": lambda i, x, k=k: -x.abs() * 1e4 - 1 if i == k else x for k in range(3)},
}


def _alternating(x: torch.Tensor) -> torch.Tensor:
    """+1, -1, +1, ... along the last axis (0 at an odd end): terms whose sum cancels exactly."""
    if x.dim() == 0:
        return torch.zeros(())
    signs = torch.ones(x.shape[-1], dtype=x.dtype)
    signs[1::2] = -1
    if x.shape[-1] % 2:
        signs[-1] = 0
    return signs
STABILITY = [r for r in RULES if r.family is Family.STABILITY]


@pytest.mark.parametrize("rule", STABILITY, ids=lambda r: r.name)
def test_stability_rules_show_their_purpose(rule):
    """At some extreme input in float32 the right side is accurate where the left side is not,
    judged against the real value on the float32 inputs (mpmath), which no CPU's libm moves;
    float64 where a side has ops mpmath has no form for (softmax, matmul: 2^29 times finer than
    the float32 errors judged)."""
    gen = torch.Generator().manual_seed(3)
    shown = []
    for _, (name, probe) in itertools.product(range(5), PROBES.items()):
        values, env = bind(rule, gen, scale=1.0)
        lhs, rhs = sides(rule, values)
        narrow = {k: probe(i, v).float() if v.is_floating_point() else v
                  for i, (k, v) in enumerate(env.items())}
        truth = exact(lhs, narrow)
        if truth is None:
            (truth,) = evaluate([rhs], narrow, reference=True)
        real = truth.isfinite()  # where the real value exists (a probe may leave the guard's domain)
        if not real.any():
            continue
        errors = []
        for side in (lhs, rhs):
            (out,) = evaluate([side], narrow, kernels=TORCH)
            out = torch.broadcast_to(torch.as_tensor(out).double(), truth.shape)[real]
            err = float((out - truth[real]).abs().max() / truth[real].abs().max())
            errors.append(err if torch.isfinite(out).all() else float("inf"))
        if errors[0] > 1e-3 and errors[1] < 1e-4:
            shown.append(name)
            break  # one probe shows it: the rest (each point exact at 60 digits) would only repeat it
    assert shown, f"{rule.name} is not more accurate than its left side at any probe"


def test_egglog_accepts_every_rule():
    eg = EGraph()
    eg.add_rules("all", RULES, wait=False)
