"""Range analysis: intervals contain every value the program computes on inputs drawn from the
declared ranges; conditions are discharged by declared ranges and op facts, never by examples."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from egraph_opt import capture, optimize

from egraph_opt.drivers import analyzer
from egraph_opt.extractors import Objective
from egraph_opt.lang.program import Program
from egraph_opt.analysis.ranges import BIG, TOP, analyze, dtype_range
from egraph_opt.lang.term import Term, evaluate, postorder

X = Term.input("x", (5, 5), "float64")
Y = Term.input("y", (5, 5), "float64")
UNARY = ["exp", "neg", "tanh", "sigmoid", "abs", "relu", "sqrt", "log", "log1p", "expm1", "erf",
         "softplus", "sin", "cos", "gelu_none", "tan", "atan", "asinh", "acosh", "atanh", "cbrt"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "logaddexp", "atan2", "hypot", "copysign"]
REDUCE = ["sum", "mean", "max", "softmax", "log_softmax", "logsumexp", "var"]


def _unary(op, a):
    return Term("gelu", (a,), ("none",)) if op == "gelu_none" else Term(op, (a,))


def _reduce(op, a):
    if op in ("softmax", "log_softmax"):
        return Term(op, (a,), (-1,))
    if op == "var":
        return Term("var", (a,), (-1, True, 0))
    return Term(op, (a,), (-1, True))


tensors = st.sampled_from([X, Y])
scores = st.builds(lambda a, b: Term("matmul", (a, Term("transpose", (b,), (-2, -1)))), tensors, tensors)
leaf = tensors | scores | st.sampled_from([Term.const(0.5), Term.const(-2.0)])
terms = st.recursive(leaf, lambda c: (
    st.builds(_unary, st.sampled_from(UNARY), c)
    | st.builds(lambda op, a, b: Term(op, (a, b)), st.sampled_from(BINARY), c, c)
    | st.builds(_reduce, st.sampled_from(REDUCE), c)
), max_leaves=5).filter(lambda t: t.op != "const")
interval = st.tuples(st.floats(-50, 50), st.floats(0, 50)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(terms, interval, interval, st.integers(0, 2**16))
def test_every_computed_value_lies_in_its_interval(term, rx, ry, seed):
    gen = torch.Generator().manual_seed(seed)
    env = {"x": rx[0] + (rx[1] - rx[0]) * torch.rand(5, 5, generator=gen, dtype=torch.float64),
           "y": ry[0] + (ry[1] - ry[0]) * torch.rand(5, 5, generator=gen, dtype=torch.float64)}
    env["x"][0, 0], env["y"][0, 0] = rx[0], ry[1]  # the interval ends themselves
    ranges = analyze([term], {"x": rx, "y": ry})
    values: dict = {}
    evaluate([term], env, record=values)
    for t in postorder([term]):
        lo, hi = ranges[id(t)]
        assert -BIG <= lo <= hi <= BIG and not (math.isnan(lo) or math.isnan(hi))
        v = torch.as_tensor(values[id(t)], dtype=torch.float64)
        v = v[torch.isfinite(v)]
        slack = 1e-9 * max(1.0, abs(lo), abs(hi))
        assert v.numel() == 0 or (float(v.min()) >= lo - slack and float(v.max()) <= hi + slack), \
            (t.op, (lo, hi), float(v.min()), float(v.max()))


@pytest.mark.parametrize("op", REDUCE)
def test_a_reduction_over_a_size_0_axis_is_bounded_as_its_identity(op):
    """sum 0, logsumexp -inf (clamped to -BIG), mean and var NaN (unbounded), max raises; never
    the operand's interval, which the identity lies outside of."""
    t = _reduce(op, Term("exp", (Term.input("x", (3, 0), "float64"),)))
    lo, hi = analyze([t], {"x": (1.0, 2.0)})[id(t)]
    try:
        v = torch.as_tensor(evaluate([t], {"x": torch.ones(3, 0, dtype=torch.float64)})[0])
    except IndexError:  # torch refuses amax over a size-0 axis
        return
    v = v.clamp(-BIG, BIG)
    assert (lo, hi) == TOP if v.isnan().any() else v.numel() == 0 or lo <= float(v.min()) <= float(v.max()) <= hi


def test_undeclared_inputs_range_over_their_dtype():
    x = Term.input("x", (3,), "float16")
    assert analyze([x])[id(x)] == dtype_range("float16") == (-65504.0, 65504.0)


def _ops_after(fn, example, ranges=None):
    program, _ = capture(fn, (example,))
    return optimize(program, input_ranges=ranges).ops_after


def test_positivity_comes_from_declared_ranges_never_from_examples():
    f = lambda x: torch.exp(torch.log(x))  # noqa: E731  exp(log x) = x needs x > 0
    positive_example = torch.rand(8) + 1
    assert {"exp": 1, "log": 1}.items() <= _ops_after(f, positive_example).items()  # (in float64: far less error)
    assert _ops_after(f, positive_example, {"x": (0.5, 4.0)}) == {}


def test_positivity_comes_from_facts_of_ops():
    f = lambda x: torch.log(torch.exp(x) * torch.exp(x))  # noqa: E731  exp > 0: log-product fires
    assert "mul" not in _ops_after(f, torch.randn(8))


def test_default_objective_never_raises_curvature():
    programs = [lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True),
                lambda x: torch.log(1 + x) * torch.tanh(x), lambda x: x.sum(-1) - x.mean(-1),
                lambda x: torch.sqrt(x * x) + torch.exp(x) - 1]
    for f in programs:
        program, _ = capture(f, (torch.randn(4, 8),))
        result = optimize(program)
        assert result.cost_after["curvature"] <= result.cost_before["curvature"]


def test_curvature_report_reads_as_a_table():
    report = analyzer.curvature(lambda x: torch.log(torch.exp(x).sum(-1)), torch.randn(3, 5))
    text = report.table()
    assert "exp(x)" in text and "kappa" in text and f"total kappa {report.total:.4g}" in text
    assert [n.op for n in report.nodes] == ["exp", "sum", "log"]
    stable = analyzer.curvature(lambda x: torch.logsumexp(x, -1), torch.randn(3, 5))
    assert stable.total < report.total


def test_log_near_one_of_a_rounded_argument_costs_more_than_log1p():
    """log(1 + x) for tiny x: the rounding of 1 + x becomes the whole result; log1p has no such
    loss, so the integer cost must prefer it (the reason the stability rule exists)."""
    from egraph_opt.extractors.curvature import kappa_cost
    tiny = (-1e-4, 1e-4)
    near_one = (1 - 1e-4, 1 + 1e-4)
    naive = kappa_cost("add", (), [(1.0, 1.0), tiny], near_one, exact=(True, True)) + \
        kappa_cost("log", (), [near_one], tiny, exact=(False,))
    assert naive >= kappa_cost("log1p", (), [tiny], tiny, exact=(True,)) + 30
    far = kappa_cost("log", (), [(1e3, 1e7)], (6.9, 16.2), exact=(False,))
    assert far < kappa_cost("log", (), [near_one], tiny, exact=(False,)) - 30


def test_overflow_is_charged_where_an_infinity_turns_finite():
    """exp(x) / sum(exp(x)) at x up to 100 divides inf by inf: charged at the division. An
    overflow that reaches the output unchanged is charged nowhere: every equivalent program
    overflows there too."""
    from egraph_opt.extractors.curvature import kappa_cost
    big = (0.0, 1e43)  # exp over [0, 100]: past float32's largest value
    assert kappa_cost("div", (), [big, big], (0.0, 1.0)) >= 3000
    assert kappa_cost("mul", (), [big, big], (0.0, 1e86)) < 3000
    assert kappa_cost("exp", (), [(0.0, 100.0)], big) < 3000
    top = 3.4028234663852886e38  # a range clipped at float32's largest value proves nothing finite
    assert kappa_cost("mul", (), [big, (-1.0, 1.0)], (-top, top)) < 3000
    # a softmax over scores that may overflow (unbounded weights): its fused attention's definition computes the same
    # scores, unseen, so charging the softmax alone made every masked attention fuse, where measured slower too
    assert kappa_cost("softmax", (-1,), [(-top, top)], (0.0, 1.0)) < 3000
    assert kappa_cost("log", (), [(0.0, top)], (-104.0, 88.8), exact=(False,)) >= 3000  # log of a consumed inf still


@pytest.mark.parametrize("hi, fused", [(40.0, False), (100.0, True)])
def test_naive_softmax_is_kept_where_it_cannot_overflow(hi, fused):
    """exp(x) / sum(exp(x)) is more accurate than the max-shifted softmax, whose rounded argument
    x - max(x) exp amplifies by up to hi - lo: the stability objective keeps it where exp cannot
    overflow (16 e^40 < 3.4e38), and fuses where it can."""
    x = Term.input("x", (4, 16))
    e = Term("exp", (x,))
    naive = Program((x,), Term("div", (e, Term("sum", (e,), (-1, True)))))
    result = optimize(naive, objective=Objective.STABILITY, input_ranges={"x": (-hi, hi)})
    assert ("softmax" in result.ops_after) is fused
    assert result.cost_after["curvature"] <= result.cost_before["curvature"]


def test_report_prices_the_input_with_what_the_egraph_proved():
    """exp(x) / (1 + exp(x)) is inf / inf at large x; only the e-graph knows the quotient is a
    sigmoid, in [0, 1]. Both programs are priced with that interval, so the consumed overflow
    shows in the cost before."""
    x = Term.input("x", (8,))
    e = Term("exp", (x,))
    program = Program((x,), Term("div", (e, Term("add", (Term.const(1.0), e)))))
    result = optimize(program, objective=Objective.STABILITY, input_ranges={"x": (-200.0, 200.0)})
    assert result.ops_after == {"sigmoid": 1}
    assert result.cost_before["curvature"] - result.cost_after["curvature"] >= 3000


def test_log_whose_rounded_argument_reaches_one_loses_every_digit():
    """log(u) of a computed u whose range holds 1: the all-digits class, as a cancellation; so do
    logsumexp and log_softmax where their result reaches 0 (the log inside is near 1). A log of
    an exact input near 1 costs nothing extra."""
    from egraph_opt.extractors.curvature import ALL_DIGITS, kappa_cost
    assert kappa_cost("log", (), [(0.5, 2.0)], (-0.7, 0.7), exact=(False,)) >= ALL_DIGITS
    assert kappa_cost("log", (), [(0.5, 2.0)], (-0.7, 0.7), exact=(True,)) < ALL_DIGITS
    assert kappa_cost("logsumexp", (-1, False), [(-5.0, 5.0)], (-2.2, 7.8)) >= ALL_DIGITS
    assert kappa_cost("logsumexp", (-1, False), [(1.0, 5.0)], (1.0, 7.8)) < ALL_DIGITS


def test_values_of_one_sign_added_never_cancel():
    """exp(x) + exp(y), both in [0, inf): the ranges of a and -b meet only at 0, where the signs
    are opposite; a difference of ranges that share a nonzero value may cancel."""
    from egraph_opt.extractors.curvature import cancels
    rounded = (False, False)
    assert not cancels("add", [(0.0, 5.0), (0.0, 3.0)], rounded)
    assert not cancels("sub", [(0.0, 5.0), (-3.0, 0.0)], rounded)
    assert cancels("sub", [(0.0, 5.0), (0.0, 3.0)], rounded)
    assert cancels("add", [(1.0, 2.0), (-3.0, -2.0)], rounded)
    assert not cancels("sub", [(0.0, 5.0), (0.0, 3.0)], (True, True))  # exact: one rounding


def test_exp_amplifies_its_arguments_error_only_where_it_is_representable():
    """exp's condition number is |x|, but past log(smallest subnormal) exp(x) is 0 (or inf) and
    carries no digit of x's error: softmax over any float32 is charged a bounded amplification,
    not the all-digits class."""
    from egraph_opt.extractors.curvature import kappa_cost
    anything = (-3.4e38, 3.4e38)
    assert kappa_cost("softmax", (-1,), [anything], (0.0, 1.0)) < 100
    rounded, exact = (kappa_cost("exp", (), [anything], (0.0, 3.4e38), exact=(e,)) for e in (False, True))
    assert 0 < rounded - exact < 100
    assert kappa_cost("exp", (), [(-50.0, 50.0)], (0.0, 6e21), exact=(False,)) > \
        kappa_cost("exp", (), [(-1.0, 1.0)], (0.3, 2.8), exact=(False,))


def test_cancellation_is_graded_by_the_proved_distance_from_zero():
    """1/x - 1/(x + 1) over x in [1e3, 1.01e3]: the e-graph proves the difference is 1/(x (x+1)) > 0
    (a guarded division rule), so the subtraction costs its amplification, not every digit."""
    from egraph_opt.extractors.curvature import ALL_DIGITS
    x = Term.input("x", (8,))
    one = Term.const(1.0)
    naive = Term("sub", (Term("div", (one, x)), Term("div", (one, Term("add", (x, one))))))
    result = optimize(Program((x,), naive), objective=Objective.STABILITY, input_ranges={"x": (1e3, 1.01e3)})
    assert 10 < result.cost_before["curvature"] < ALL_DIGITS
    assert result.cost_after["curvature"] < result.cost_before["curvature"]
