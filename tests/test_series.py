"""Series rules (rulesets/series.py) against the exact function: each is its left side's Taylor
polynomial, and its truncation error on every interval |x| <= r it may be used on stays within the
bound the regimes count (computed exactly, at 60 digits, over a dense grid)."""
import math

import mpmath
import pytest
import sympy
import torch

from egraph_opt.lang.term import Term, evaluate
from egraph_opt.lang import pattern as pat
from egraph_opt.rulesets import Exactness, Family, catalogue
from egraph_opt.rulesets.series import ROWS, TARGET

from test_rule_soundness import SYMPY, to_sympy

X = sympy.Symbol("x", real=True)


def _lhs(row):
    return to_sympy(pat.parse(row.lhs), {"x": X})


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_series_is_the_taylor_polynomial_of_its_left_side(row):
    """lhs - rhs vanishes to the order past the degree: the rule's right side is the truncated
    series, written in Horner form."""
    rhs = to_sympy(pat.parse(row.rule().rhs), {"x": X})
    order = row.shift + (2 if row.square else 1) * (row.degree + 1)
    residue = sympy.series(_lhs(row) - rhs, X, 0, order + 2).removeO()
    coefficients = sympy.Poly(residue, X).all_coeffs()[::-1]  # by power, the constant first
    low, high = coefficients[:order], coefficients[order:]
    assert all(abs(float(c)) < 1e-15 for c in low)  # the rule's constants are float64 roundings
    assert any(abs(float(c)) > 1e-12 for c in high)  # truncated there, not exact


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_truncation_stays_within_its_bound_on_every_interval(row):
    """On |x| <= r, for r from a tenth of the radius to the radius, the exact polynomial's relative
    error against the function is at most ``truncation(r)``, which at the radius is the target."""
    f = sympy.lambdify(X, _lhs(row), modules="mpmath")
    coefficients = [row.coefficient(k) for k in range(row.degree + 1)]
    with mpmath.workdps(60):
        for r in (row.radius / 10, row.radius / 3, row.radius):
            bound = float(row.truncation(torch.tensor(r)))
            worst = 0.0
            for i in range(1, 81):
                for x in (mpmath.mpf(r) * i / 80, -mpmath.mpf(r) * i / 80):
                    u = x * x if row.square else x
                    p = sum(mpmath.mpf(c.numerator) / c.denominator * u ** k
                            for k, c in enumerate(coefficients)) * x ** row.shift
                    exact = f(x)
                    worst = max(worst, float(abs(p - exact) / abs(exact)))
            assert worst <= bound, f"{row.name}: {worst:.3g} > bound {bound:.3g} on |x| <= {r}"
            assert bound <= TARGET * 1.0001 or r > row.radius
    assert math.isinf(float(row.truncation(torch.tensor(row.radius * 1.01))))  # past its radius


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_series_rule_is_approximate_of_its_own_family_and_guarded_by_its_radius(row):
    rule = catalogue()[row.name]
    assert rule.family is Family.SERIES and rule.exactness is Exactness.APPROX
    assert str(rule.when) == f"(<= (hi ?x) {row.radius!r}) (>= (lo ?x) {-row.radius!r})"
    x = Term.input("x", (5,), "float64")
    env = {"x": torch.linspace(-row.radius, row.radius, 5, dtype=torch.float64)}
    lhs, rhs = (pat.instantiate(p, {"x": x}) for p in (rule.lhs_pattern, rule.rhs_pattern))
    (left,), (right,) = evaluate([lhs], {"x": env["x"] + 1e-3}), evaluate([rhs], {"x": env["x"] + 1e-3})
    torch.testing.assert_close(right, left, rtol=1e-6, atol=0)  # float64 left side: few digits lost
    assert set(SYMPY) >= {n.op for n in _ops(rule.rhs_pattern)}


def _ops(p):
    stack, out = [p], []
    while stack:
        q = stack.pop()
        if isinstance(q, pat.Node):
            out.append(q)
            stack.extend(q.args)
    return [q for q in out if q.op != "const"]
