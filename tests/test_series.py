"""Series derived from a program's function (rulesets/series.py) against the exact function: each is
its function's Taylor polynomial around 0, or around infinity in u = 1/x, and its truncation error
on every interval |u| <= r it may be used on stays within the bound the regimes count (measured
here again, exactly, at 60 digits, over a denser grid than the derivation's)."""
import math

import mpmath
import pytest
import sympy
import torch

from egraph_opt.lang.term import Term, evaluate
from egraph_opt.lang import pattern as pat
from egraph_opt.rulesets import Exactness, Family
from egraph_opt.rulesets.series import TARGET, expand

from test_rule_soundness import SYMPY, to_sympy

X = sympy.Symbol("x", real=True)

#: functions as pattern text over ?x, each with the side its series is taken on: the four a table
#: once held, then others from the literature (not Hamming's NMSE problems)
FUNCTIONS = [
    ("(div (sub (const 1.0) (cos ?x)) (mul ?x ?x))", False),
    ("(div (sub (expm1 ?x) ?x) (mul ?x ?x))", False),
    ("(div (sub ?x (sin ?x)) (mul (mul ?x ?x) ?x))", False),
    ("(sub (exp ?x) (exp (neg ?x)))", False),
    ("(sub (mul (const 0.5) (sub (exp ?x) (exp (neg ?x)))) ?x)", False),  # sinh x - x
    ("(sub ?x (atan ?x))", False),
    ("(div (log (add (const 1.0) ?x)) ?x)", False),
    ("(sub (tan ?x) (sin ?x))", False),
    ("(div (const 1.0) (sub ?x (div (const 1.0) ?x)))", True),
    ("(sub (div (const 1.0) (sub ?x (div (const 1.0) ?x))) (div (const 1.0) ?x))", True),
]


def _series(text, at_infinity):
    x = Term.input("x", (8,), "float32")
    return expand(pat.instantiate(pat.parse(text), {"x": x}), x, at_infinity)


@pytest.fixture(scope="module", params=FUNCTIONS, ids=lambda f: f"{f[0]}{' at inf' if f[1] else ''}")
def derived(request):
    text, at_infinity = request.param
    found = _series(text, at_infinity)
    assert found is not None and len(found.terms) >= 1
    return text, found


def test_series_is_the_taylor_polynomial_of_its_function(derived):
    """function - rule's right side vanishes in u up to the power past the degree: the right side
    is the truncated series, written in Horner form."""
    text, series = derived
    u = sympy.Symbol("u", positive=True)
    lhs, rhs = (to_sympy(pat.parse(t), {"x": X}) for t in (text, series.rule().rhs))
    difference = (lhs - rhs).subs(X, 1 / u if series.at_infinity else u)
    order = series.shift + (2 if series.square else 1) * len(series.terms)
    residue = sympy.expand(sympy.series(difference, u, 0, order + 1).removeO())
    exact = sympy.expand(sympy.series(lhs.subs(X, 1 / u if series.at_infinity else u), u, 0, order + 1).removeO())
    low = [residue.coeff(u, k) for k in range(min(series.shift, 0) - 2, order)]
    assert all(abs(float(c)) < 1e-15 for c in low)  # the rule's constants are float64 roundings
    assert float(exact.coeff(u, order)) != 0  # truncated there, not exact: what is left is the
    assert float(residue.coeff(u, order)) == pytest.approx(float(exact.coeff(u, order)), rel=1e-9)  # term past it


def test_truncation_stays_within_its_bound_on_every_interval(derived):
    """On |u| <= r, for r from a hundredth of the radius to the radius, the exact polynomial's
    relative error against the function is at most ``truncation(r)``, at most the target."""
    text, series = derived
    f = sympy.lambdify(X, to_sympy(pat.parse(text), {"x": X}), modules="mpmath")
    step = 2 if series.square else 1
    with mpmath.workdps(60):
        terms = [mpmath.mpf(str(c.evalf(70))) for c in series.terms]
        for r in (series.radius / 100, series.radius / 10, series.radius / 3, series.radius):
            bound, worst = float(series.truncation(torch.tensor(r))), 0.0
            for i in range(1, 201):
                for u in (mpmath.mpf(r) * i / 200, -mpmath.mpf(r) * i / 200):
                    p = sum(c * u ** (step * k) for k, c in enumerate(terms))
                    exact = f(1 / u if series.at_infinity else u)
                    worst = max(worst, float(abs((p * u ** series.shift - exact) / exact)))
            assert worst <= bound <= TARGET, f"{text}: {worst:.3g} > bound {bound:.3g} on |u| <= {r}"
    assert math.isinf(float(series.truncation(torch.tensor(series.radius * 1.01))))  # past its radius


def test_series_rule_is_approximate_of_its_own_family_and_close_within_its_radius(derived):
    """Its guard is its truncation bound (infinite past the radius: the regimes never take it there)."""
    text, series = derived
    rule = series.rule()
    assert rule.family is Family.SERIES and rule.exactness is Exactness.APPROX
    r = series.radius
    x = Term.input("x", (5,), "float64")
    u = torch.linspace(r / 2, r, 5, dtype=torch.float64)
    env = {"x": 1 / u if series.at_infinity else u}
    lhs, rhs = (pat.instantiate(pat.parse(t), {"x": x}) for t in (text, rule.rhs))
    (left,), (right,) = evaluate([lhs], env), evaluate([rhs], env)
    torch.testing.assert_close(right, left, rtol=1e-6, atol=0)  # float64 left side: few digits lost
    assert set(SYMPY) >= {n.op for n in _ops(rule.rhs_pattern)}


@pytest.mark.parametrize("text,at_infinity", [
    ("(sub (sqrt (add ?x (const 1.0))) (sqrt ?x))", False),  # a power series in sqrt(x), not x
    ("(div (sub (const 1.0) (cos ?x)) (mul ?x ?x))", True),  # cos(1/u): no expansion at u = 0
    ("(sub ?x (atan ?x))", True),  # x - pi/2 + 1/x... at +inf, x + pi/2 ... at -inf: no one series
    ("(log ?x)", False),  # undefined at x <= 0
])
def test_no_series_where_the_function_has_none(text, at_infinity):
    found = _series(text, at_infinity)
    assert found is None or found.radius < 1e-6  # (x - atan x: at most where pi/2 is below the target)


def _ops(p):
    stack, out = [p], []
    while stack:
        q = stack.pop()
        if isinstance(q, pat.Node):
            out.append(q)
            stack.extend(q.args)
    return [q for q in out if q.op != "const"]


def test_a_constant_sympy_has_no_number_for_gives_no_series():
    """sympy.Rational(inf) is 0: a program with an infinite constant must not become another function."""
    assert _series("(sub (add ?x (const inf)) (sin ?x))", False) is None


@pytest.mark.parametrize("text", ["(sub (maximum ?x (const -1.0)) (sin ?x))", "(sub (minimum ?x (const 1.0)) ?x)",
                                  "(sub (trunc ?x) (sin ?x))"])
def test_an_op_whose_sympy_namesake_is_another_thing_gives_no_series(text):
    """sympy.maximum is a function's maximum over a domain and sympy.trunc a polynomial's truncation:
    a namesake stands for an op only as a sympy function class (fuzz seed 730 raised inside sympy)."""
    assert _series(text, False) is None


def test_sqrt_is_spelled_for_sympy():
    found = _series("(sub (sqrt (add (const 1.0) ?x)) (const 1.0))", False)
    assert found is not None and found.shift == 1 and found.terms[:2] == (sympy.Rational(1, 2), sympy.Rational(-1, 8))


def test_a_time_out_is_not_kept_in_the_cache(monkeypatch):
    """sympy's time ran out (a loaded machine): no series now, but the next call may derive it."""
    import egraph_opt.rulesets.series as S
    S._expand.cache_clear()
    monkeypatch.setattr(S, "SECONDS", 1e-3)  # sympy takes longer
    assert _series("(sub (sinh ?x) ?x)", False) is None
    monkeypatch.setattr(S, "SECONDS", 2.0)
    assert _series("(sub (sinh ?x) ?x)", False) is not None


@pytest.mark.parametrize("seconds", [2.0, 1e-3])
def test_series_are_derived_and_timed_out_off_the_main_thread_too(monkeypatch, seconds):
    """A Dask worker's or a server's thread gets the series the main thread gets (the alarm signal
    that once stopped sympy is the main thread's only); past its time sympy stops there too, and
    nothing of the deadline is left to fire on the thread afterwards."""
    import threading
    import time
    import egraph_opt.rulesets.series as S
    S._expand.cache_clear()
    monkeypatch.setattr(S, "SECONDS", seconds)
    out = {}

    def work():
        start = time.perf_counter()
        out["series"] = _series("(sub (sinh ?x) ?x)", False)
        out["seconds"] = time.perf_counter() - start
        time.sleep(4 * seconds)
        out["after"] = sum(range(10 ** 5))  # a TimeoutError left pending would end the thread here
    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert out.get("after") == sum(range(10 ** 5))
    assert (out["series"] is not None) == (seconds == 2.0)
    assert out["seconds"] < 1.0 or seconds == 2.0


def test_a_deadline_whose_exit_never_ran_stops_once_its_frame_is_gone():
    """An exception may land in the deadline's ``__exit__`` before it stops the timer: the timer
    then stops by itself once the frame that entered returned, so nothing fires into later code."""
    import threading
    import time
    import egraph_opt.rulesets.series as S
    out = {}

    def enter():
        S._Deadline(0.05).__enter__()  # and returns: as if __exit__ had been cut short

    def work():
        enter()
        time.sleep(0.5)
        out["after"] = True  # a TimeoutError fired meanwhile is raised here
    thread = threading.Thread(target=work)
    thread.start()
    thread.join(10)
    assert out.get("after")
