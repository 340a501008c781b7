"""Proof obligations generated from the rule catalogue, never written per rule.

- sympy: rules over elementwise scalar ops are identities over the reals;
- float64: both sides agree on random tensors wherever the left side is finite (definedness: the
  right side must be finite there too);
- purpose: each stability rule, at some extreme input in float32, keeps accuracy where its left side
  loses it.
"""
import itertools
import operator

import pytest
import sympy
import torch

from egraph_opt import pattern as pat
from egraph_opt.egraph import EGraph
from egraph_opt.rulesets import Exactness, Family, catalogue
from egraph_opt.term import Term, evaluate

RULES = list(catalogue().values())
SHAPE = (2, 3, 5, 5)  # every tensor variable: square trailing dims fit matmul and attention
TOLERANCE = {Exactness.EXACT: 1e-9, Exactness.REASSOC: 1e-9, Exactness.APPROX: 1e-3}
_COMPARE = {"!=": operator.ne, "<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge}
_SIGNS = {"positive": 1, "nonneg": 1, "nonzero": 0}  # sampled magnitude >= 0.1; 1: positive sign


def conditions(rule) -> tuple[dict[str, str], list[str]]:
    """Sign facts required of tensor variables, and primitive comparisons on attributes. Dtype
    conditions (``dtype-of``) hold vacuously in the float64 reference, where casts are exact."""
    signs, compares = {}, []
    for fact in rule.when:
        head, *args = fact.strip("()").split()
        if head in _SIGNS:
            signs[args[0][1:]] = head
        elif head in _COMPARE:
            compares.append(fact)
        elif not fact.startswith("(= (dtype-of"):
            raise AssertionError(f"{rule.name}: the proof sampler does not know fact {fact}")
    return signs, compares


def holds(fact: str, bindings: dict) -> bool:
    """Primitive conditions (``(!= ?c 0.0)``) evaluated on attribute bindings."""
    head, *args = fact.strip("()").split()
    values = [bindings[a[1:]] if a.startswith("?") else float(a) for a in args]
    return _COMPARE[head](*values)


def index_vars(p) -> set[str]:
    """Tensor variables used as gather/index_select indices: sampled as integer positions."""
    found, stack = set(), [p]
    while stack:
        q = stack.pop()
        if isinstance(q, pat.Node):
            if q.op in ("gather", "index_select") and isinstance(q.args[1], pat.Var):
                found.add(q.args[1].name)
            stack.extend(q.args)
    return found


def bind(rule, gen: torch.Generator, dtype=torch.float64, scale=2.0) -> tuple[dict, dict]:
    """Random bindings satisfying the rule's conditions: tensors by name and attribute values."""
    sorts = pat.variables(rule.lhs_pattern)
    signs, compares = conditions(rule)
    indices = index_vars(rule.lhs_pattern)
    for _ in range(100):
        values, env = {}, {}
        for name, sort in sorts.items():
            if sort == pat.TENSOR:
                if name in indices:
                    env[name] = torch.randint(0, SHAPE[-1], SHAPE, generator=gen)
                    values[name] = Term.input(name, SHAPE, "int64")
                    continue
                x = torch.randn(SHAPE, generator=gen, dtype=dtype) * scale
                if name in signs:
                    x = x.abs() + 0.1
                    x = x if _SIGNS[signs[name]] else x * torch.randn(SHAPE, generator=gen).sign()
                env[name] = x
                values[name] = Term.input(name, SHAPE)
            elif sort == "i64":
                values[name] = int(torch.randint(-2, 0, (), generator=gen))  # an axis
            elif sort == "bool":
                values[name] = bool(torch.randint(0, 2, (), generator=gen))
            elif sort == "f64":
                values[name] = float(torch.empty(()).uniform_(-3, 3, generator=gen))
            else:
                raise AssertionError(f"no sampler for {sort}")
        if all(holds(f, values) for f in compares):
            return values, env
    raise AssertionError(f"{rule.name}: could not satisfy {rule.when}")


def sides(rule, values):
    return pat.instantiate(rule.lhs_pattern, values), pat.instantiate(rule.rhs_pattern, values)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_both_sides_agree_in_float64(rule):
    gen = torch.Generator().manual_seed(7)
    for _ in range(5):
        values, env = bind(rule, gen)
        lhs, rhs = evaluate(list(sides(rule, values)), env, reference=True)
        lhs, rhs = torch.broadcast_tensors(torch.as_tensor(lhs), torch.as_tensor(rhs))
        defined = torch.isfinite(lhs)
        assert torch.isfinite(rhs[defined]).all(), f"{rule.name}: right side undefined where left is not"
        torch.testing.assert_close(rhs[defined], lhs[defined], rtol=TOLERANCE[rule.exactness],
                                   atol=TOLERANCE[rule.exactness])


SYMPY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
         "pow": operator.pow, "neg": operator.neg, "exp": sympy.exp, "log": sympy.log,
         "log1p": lambda x: sympy.log(1 + x), "expm1": lambda x: sympy.exp(x) - 1,
         "sqrt": sympy.sqrt, "rsqrt": lambda x: 1 / sympy.sqrt(x), "abs": sympy.Abs,
         "sin": sympy.sin, "cos": sympy.cos, "tanh": sympy.tanh,
         "sigmoid": lambda x: 1 / (1 + sympy.exp(-x)), "erf": sympy.erf}


def to_sympy(p, symbols):
    if isinstance(p, pat.Var):
        return symbols.setdefault(p.name, sympy.Symbol(p.name, real=True))
    if isinstance(p, pat.Lit):
        return sympy.nsimplify(p.value)
    if isinstance(p, pat.Prim):
        return pat.PRIMITIVES[p.fn](*(to_sympy(a, symbols) for a in p.args))
    if p.op == "const":
        return to_sympy(p.attrs[0], symbols)
    return SYMPY[p.op](*(to_sympy(a, symbols) for a in p.args))


def scalar(p) -> bool:
    return not isinstance(p, pat.Node) or (
        (p.op in SYMPY or p.op == "const") and all(scalar(a) for a in p.args))


SCALAR_RULES = [r for r in RULES if scalar(r.lhs_pattern) and scalar(r.rhs_pattern)]


def test_scalar_rules_are_found():
    assert {"log-exp-cancel", "log1p-from-log", "div-const-to-mul"} <= {r.name for r in SCALAR_RULES}


@pytest.mark.parametrize("rule", SCALAR_RULES, ids=lambda r: r.name)
def test_scalar_rules_are_identities_over_the_reals(rule):
    symbols: dict = {}
    lhs, rhs = to_sympy(rule.lhs_pattern, symbols), to_sympy(rule.rhs_pattern, symbols)
    assert sympy.simplify(sympy.expand_log(lhs - rhs, force=True).rewrite(sympy.exp)) == 0


PROBES = {  # extreme inputs, as f(position of the variable, value)
    "large": lambda i, x: x * 300, "offset": lambda i, x: x + 1e6, "tiny": lambda i, x: x * 1e-9,
    "huge": lambda i, x: x * 1e25, "spread": lambda i, x: x * (1e25 if i == 0 else 1e-25),
    "opposed": lambda i, x: x + (100 if i == 0 else -100),
}
STABILITY = [r for r in RULES if r.family is Family.STABILITY]


@pytest.mark.parametrize("rule", STABILITY, ids=lambda r: r.name)
def test_stability_rules_show_their_purpose(rule):
    """At some extreme input in float32 the right side is accurate where the left side is not."""
    gen = torch.Generator().manual_seed(3)
    shown = []
    for _, (name, probe) in itertools.product(range(5), PROBES.items()):
        values, env = bind(rule, gen, scale=1.0)
        lhs, rhs = sides(rule, values)
        narrow = {k: probe(i, v).float() if v.is_floating_point() else v
                  for i, (k, v) in enumerate(env.items())}
        (truth,) = evaluate([rhs], narrow, reference=True)  # exact result on the float32 inputs
        errors = []
        for side in (lhs, rhs):
            (out,) = evaluate([side], narrow)
            out = torch.as_tensor(out).double()
            err = float((out - truth).abs().max() / truth.abs().max())
            errors.append(err if torch.isfinite(out).all() else float("inf"))
        if errors[0] > 1e-3 and errors[1] < 1e-4:
            shown.append(name)
    assert shown, f"{rule.name} is not more accurate than its left side at any probe"


def test_egglog_accepts_every_rule():
    eg = EGraph()
    eg.add_rules("all", RULES)
