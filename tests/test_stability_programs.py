"""Naive programs, traced on moderate inputs, stay accurate at extreme inputs once optimized."""
import copy
import math
import re
import warnings

import pytest
import torch

from egraph_opt import saturate_and_extract


def naive_softmax(x):
    return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)


def naive_logsumexp(x):
    return torch.log(torch.exp(x).sum(-1))


def naive_log_softmax(x):
    return torch.log(torch.exp(x) / torch.exp(x).sum(-1, keepdim=True))


def naive_attention(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True) @ v


def naive_log1p(x):
    return torch.log(1 + x)


def naive_signed_asinh(x):  # libm's and Rust's spelling: the odd function from its value at |x|
    return torch.copysign(torch.log(x.abs() + torch.sqrt(x * x + 1)), x)


def naive_pair_softmax(a, b):  # two classes' softmax, a pairwise preference
    return torch.exp(a) / (torch.exp(a) + torch.exp(b))


def naive_truncated_exp_log(y, z):  # log of a blend of 1 and e^z (a truncated exponential's inverse)
    return torch.log((1 - y) + y * torch.exp(z))


def naive_gate_complement(x):  # GRU's 1 - z, a probability's complement
    return 1 - torch.sigmoid(x)


def naive_expanded_square(x):  # (x + 1)^2 - 1: x + 1 drops the digits of a small x
    return (x + 1) * (x + 1) - 1


def truth_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v


#  naive program       float64 truth                               input shapes     extreme input
CASES = [
    (naive_softmax,      lambda x: torch.softmax(x, -1),           [(4, 16)],       lambda x: x * 100),
    (naive_logsumexp,    lambda x: torch.logsumexp(x, -1),         [(4, 16)],       lambda x: x * 100),
    (naive_log_softmax,  lambda x: torch.log_softmax(x, -1),       [(4, 16)],       lambda x: x * 100),
    (naive_attention,    truth_attention,                          [(2, 8, 16)] * 3, lambda x: x * 8),
    (naive_log1p,        torch.log1p,                              [(64,)],         lambda x: x.abs() * 1e-5),
    (naive_signed_asinh, torch.asinh,                              [(64,)],         lambda x: x * 1e-5),
    (naive_pair_softmax, lambda a, b: torch.sigmoid(a - b),        [(64,)] * 2,     lambda x: x * 100),
    (naive_truncated_exp_log, lambda y, z: torch.log1p(y * torch.expm1(z)), [(64,)] * 2, lambda x: x.abs() * 1e-2),
    (naive_gate_complement, lambda x: torch.sigmoid(-x),           [(64,)],         lambda x: x.abs() + 12),
    (naive_expanded_square, lambda x: x * (x + 2),                 [(64,)],         lambda x: x * 1e-5),
]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}


def error(out, truth):
    if not torch.isfinite(out).all():
        return math.inf
    return float((out.double() - truth).abs().max() / truth.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("naive,truth,shapes,extreme", CASES, ids=[c[0].__name__ for c in CASES])
def test_naive_program_becomes_accurate_at_extreme_inputs(naive, truth, shapes, extreme, dtype):
    gen = torch.Generator().manual_seed(0)
    moderate = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    optimized = saturate_and_extract(naive)
    optimized(*moderate)  # traced and optimized on moderate inputs
    assert optimized.report.optimized, optimized.report.fallback

    hard = [extreme(x.float()).to(dtype) for x in moderate[:2]] + moderate[2:]
    reference = truth(*(x.double() for x in hard))
    assert error(naive(*hard), reference) > TOLERANCE[dtype]  # the case is really hard
    assert error(optimized(*hard), reference) < TOLERANCE[dtype]


def test_half_precision_network_rounds_once():
    """A float16 conv net computes in float32 from its input to its output (through ReLU, max
    pooling and flatten) and rounds once: two runtime casts, and less error against float64."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 4 * 4, 10)).eval().half()
    optimized = saturate_and_extract(net, objective="stability")
    x = torch.randn(64, 3, 8, 8).half()
    with torch.no_grad():
        out, naive = optimized(x), net(x)
        truth = copy.deepcopy(net).double()(x.double())
    assert "torch.cast x2" in str(optimized.report) and out.dtype == torch.float16
    assert (out.double() - truth).abs().mean() < 0.8 * (naive.double() - truth).abs().mean()


def test_sum_of_values_that_cancel_is_compensated():
    """A float32 sum of raw inputs of both signs can cancel (1e8, small values, -1e8): the optimized
    program sums with compensation and keeps the small values the plain sum drops."""
    optimized = saturate_and_extract(lambda x: x.sum(-1))
    x = torch.rand(4, 256, generator=torch.Generator().manual_seed(0))
    optimized(x)  # traced on moderate inputs
    assert [name for name, _, _ in optimized.report.rewrites] == ["sum-compensated"]
    x[:, 0], x[:, -1] = 1e8, -1e8
    truth = x.double().sum(-1)
    assert error(x.sum(-1), truth) > 1e-2
    assert error(optimized(x), truth) < 1e-6


class _NaiveLayerNorm(torch.nn.Module):
    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt((x * x).mean(-1, keepdim=True) - mu * mu + 1e-5)


def test_half_precision_chain_crosses_repeated_blocks():
    """Repeated blocks are optimized once each as templates; each would round its output to
    float16 and the next widen it again. The joined program rounds once: two runtime casts."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), _NaiveLayerNorm(), torch.nn.ReLU(),
                              torch.nn.Linear(32, 32), _NaiveLayerNorm(), torch.nn.ReLU(),
                              torch.nn.Linear(32, 4)).eval().half()
    optimized = saturate_and_extract(net, objective="stability")
    x = torch.randn(64, 16).half()
    with torch.no_grad():
        out, naive = optimized(x), net(x)
        truth = copy.deepcopy(net).double()(x.double())
    assert "template of" in str(optimized.report)
    assert "torch.cast x2" in str(optimized.report) and out.dtype == torch.float16
    assert (out.double() - truth).abs().max() <= (truth.half().double() - truth).abs().max()
    assert (out.double() - truth).abs().mean() < 0.8 * (naive.double() - truth).abs().mean()


def test_half_precision_masked_attention_rounds_once():
    """A float16 causal attention (a -inf mask: exact infinities, meant, not overflow) computes
    in float32 and rounds once, at its output."""
    from egraph_opt import capture, optimize
    from egraph_opt.extractors import Objective
    from egraph_opt.lang.term import postorder

    def attention(q, k, v):
        scores = (q @ k.transpose(-2, -1) * 0.25).masked_fill(
            torch.triu(torch.ones(8, 8, dtype=torch.bool), 1), float("-inf"))
        return torch.softmax(scores, -1) @ v

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 16, generator=gen).half() for _ in "qkv")
    program, _ = capture(attention, (q, k, v))
    result = optimize(program, objective=Objective.STABILITY)
    narrowing = [t for t in postorder(result.program.roots()) if t.op == "cast" and t.attrs[0] == "float16"]
    assert len(narrowing) == 1


def _root_difference(x):
    return torch.sqrt(x + 1) - torch.sqrt(x)


@pytest.mark.parametrize("objective, max_slowdown, accurate", [
    ("balanced", 4.0, True), ("stability", 4.0, True), ("latency", 4.0, False), ("balanced", 1.0, False)])
def test_the_default_objective_takes_a_far_more_accurate_program_within_max_slowdown(objective, max_slowdown,
                                                                                   accurate):
    """sqrt(x + 1) - sqrt(x), traced on moderate inputs with no range declared, run at x ~ 1e7: the
    difference cancels entirely (100% error). Balanced takes the rationalized form, sampled 8 bits
    and more better, whatever its latency within ``max_slowdown`` (the estimated ~1.1x of one
    division more is past 1.0); latency keeps the old trade. The report says what it cost."""
    f = saturate_and_extract(_root_difference, objective=objective, max_slowdown=max_slowdown,
                             profile_db=False, profile_budget=0)  # static: rows other tests timed price nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error" if accurate else "ignore", UserWarning)  # never a fallback
        f(torch.rand(1000) * 10 + 1)
    big = torch.tensor([1e7, 3e7, 1e8])
    truth = 1 / (torch.sqrt(big.double() + 1) + torch.sqrt(big.double()))
    error = ((f(big).double() - truth) / truth).abs().max().item()
    assert (error < 1e-6) == accurate, (error, str(f.report))
    if accurate and objective == "balanced":
        assert "sqrt-difference" in str(f.report)
        report = copy.copy(f.report)
        report.measured = [1e-6, 2.5e-6]  # as if timed: what the accuracy cost is said
        assert re.search(r"\[TRADE\] accuracy bought with time: error worst [\d.]+ -> [\d.]+ bits, "
                         r"mean [\d.]+ -> [\d.]+ bits, for 2.50x the original's time", str(report))


def test_max_slowdown_is_a_factor_of_at_least_one():
    with pytest.raises(ValueError, match="max_slowdown must be a factor >= 1, not 0.5"):
        saturate_and_extract(_root_difference, max_slowdown=0.5)



def test_a_large_elementwise_program_is_sampled_small_and_still_made_accurate():
    """Per-element error does not depend on the shape: 100,000 elements are judged on 256, so the
    default's accuracy-first rule is not bounded by the input's size."""
    f = saturate_and_extract(_root_difference, profile_budget=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        f(torch.rand(100_000) * 10 + 1)
    assert [name for name, _, _ in f.report.rewrites] == ["sqrt-difference"]


def _rms(x, y, z):
    return torch.sqrt((x * x + y * y + z * z) / 3.0)


@pytest.mark.parametrize("objective", ["balanced", "stability"])
def test_a_small_float32_program_no_float32_form_fixes_is_computed_in_float64(objective):
    """sqrt((x^2 + y^2 + z^2) / 3) over every float32 (x^2 overflows from 2e19, underflows below 1e-23): no
    float32 form found is accurate, the program in float64 is, rounded once to float32, and the report says
    so; half inputs, a matmul beside it and the latency objective are never widened."""
    x = torch.tensor([1e30, 3e-30, 1.0, -2e20])
    f = saturate_and_extract(_rms, objective=objective, profile_budget=0)
    exact = torch.sqrt((x.double() ** 2 * 3) / 3.0).float()
    torch.testing.assert_close(f(x, x, x), exact, rtol=2 ** -23, atol=0)
    assert not torch.isfinite(_rms(x, x, x)).all() and ("float64" in [n for n, _, _ in f.report.rewrites])
    assert "[REWRITE] float64: computed in float64 from its float32 inputs, rounded once" in str(f.report)
    w = torch.randn(4, 4)
    for g, args in [(saturate_and_extract(_rms, objective=objective), (x.half(),) * 3),
                    (saturate_and_extract(_rms, objective="latency"), (x,) * 3),
                    (saturate_and_extract(lambda a: torch.sqrt(a @ w * (a @ w) + 1.0), objective=objective),
                     (torch.randn(3, 4),))]:
        g(*args)
        assert g.report.optimized and all(n != "float64" for n, _, _ in g.report.rewrites), g.report


def _root_beside_its_square(a, b, m):  # Henrywood and Agarwal's x + sqrt(x^2 - M^2), x a product
    x = a * b
    return x + torch.sqrt(x * x - m * m)


def test_the_default_computes_in_float64_the_form_that_does_not_cancel():
    """x + sqrt(x^2 - m^2), x = ab, over every float32: x^2 overflows float32 (float64 keeps it) and for x < 0 the sum
    cancels (float64 too: the conjugate m^2 / (x - sqrt(x^2 - m^2)) does not). Neither alone is accurate; the default
    objective takes the conjugate's form in float64, far more accurate within max_slowdown (6x here: the empty test
    database prices every op at the roofline's 5 us, the scaled conjugate's 25 ops past 4x; timed, it is 3.2x). In
    float32 alone the conjugate's few bits buy less than its time: chosen before float64 was weighed, it was not."""
    f = saturate_and_extract(_root_beside_its_square, profile_budget=0, max_slowdown=6.0)
    a, b = torch.tensor([-1e20, -3.0, 2.0, -1e10]), torch.tensor([1e5, 1e3, 5.0, 1e12])
    m = torch.tensor([1.0, 0.5, 3.0, 2.0])
    x, mm = a.double() * b.double(), m.double() ** 2
    exact = torch.where(x < 0, mm / (x - torch.sqrt(x * x - mm)), x + torch.sqrt(x * x - mm)).float()
    torch.testing.assert_close(f(a, b, m), exact, rtol=2 ** -22, atol=0)
    rewrites = [n for n, _, _ in f.report.rewrites]
    assert "float64" in rewrites and "root-beside-its-square" in rewrites, f.report
    naive = _root_beside_its_square(a, b, m)
    assert not torch.isfinite(naive[0]) and abs(float(naive[1] / exact[1]) - 1) > 0.5


def _phi(y, k):
    return torch.atan(torch.exp(y / k)) - math.pi / 4.0  # doubled, it is the Gudermannian: a rule of its own


def test_float64_computes_with_the_constants_as_written():
    """atan(e^(y/k)) - pi/4 cancels near y = 0: float32's sum is exact there and its error is pi/4 rounded to
    float32 (4e-8 off, 19% of the result at y = 1e-6). The program in float64 takes pi/4 as the Python float
    written, not as float32 rounded it (which was 4.7 bits worse than float32 on FPBench's inverse-phipp)."""
    f = saturate_and_extract(_phi, profile_db=False, profile_budget=0)  # the rows other tests timed: none
    y, k = torch.tensor([1e-6, -3e-7, 2.0, 1e-4]), torch.tensor([1.0, 1.0, 3.0, 1.0])
    exact = torch.atan(torch.exp(y.double() / k.double())) - math.pi / 4.0
    torch.testing.assert_close(f(y, k).double(), exact, rtol=2 ** -23, atol=0)
    assert [n for n, _, _ in f.report.rewrites] == ["float64"]
    assert ((_phi(y, k).double() - exact) / exact).abs().max() > 0.1


def test_a_reciprocal_times_a_value_rounds_once():
    """(1/x) y as y/x: one rounding, and no 1/x overflowing at a subnormal x. FPBench's "sqrt sqr",
    x/x - (1/x) sqrt(x x), is then 0 or 2 exactly where the naive form gives +-inf."""
    optimized = saturate_and_extract(lambda x: x / x - (1 / x) * torch.sqrt(x * x))
    optimized(torch.randn(64, generator=torch.Generator().manual_seed(0)))
    assert {"recip-mul-to-div", "mul-recip-to-div"} & {name for name, _, _ in optimized.report.rewrites}
    x = torch.tensor([1e-39, -1e-39, 3.0, -7.0, 1e30, -1e30])
    assert torch.equal(optimized(x), torch.tensor([0.0, 2.0, 0.0, 2.0, 0.0, 2.0]))


def test_inverse_square_divides_twice():
    """x / (y * y) (Coulomb's force) overflows y * y at |y| > 2^64 where x / y / y is finite: the default objective,
    with no range declared, divides twice (without the rule only the float64 form is accurate)."""
    optimized = saturate_and_extract(lambda x, y: x / (y * y))
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(64, generator=gen) + 1, torch.rand(64, generator=gen) + 1
    optimized(x, y)  # traced on moderate inputs
    x, y = x * 1e20, y * 1e20
    truth = x.double() / y.double() ** 2
    assert (x / (y * y) == 0).all() and truth.min() > 0  # y * y overflowed everywhere
    torch.testing.assert_close(optimized(x, y).double(), truth, rtol=1e-6, atol=0)
    assert "cast" not in optimized.report.ops_after  # in float32, not float64 (casts that cost more than a division)


def test_float64_casts_only_the_inputs_no_float64_operand_promotes():
    """(a1 a2) / (b1 b2) over every float32 (each product overflows or underflows alone) is exact in float64. Casting
    each of its four inputs cost 4.3x the original's time at 128 elements, past the default's 4x; an input beside a
    float64 operand is promoted by torch with no kernel of its own: a1 and b1 are cast, a2 and b2 are not."""
    f = saturate_and_extract(lambda a1, a2, b1, b2: a1 * a2 / (b1 * b2), profile_budget=0)
    a1, a2, b1, b2 = (torch.tensor(v * 32) for v in ([1e30, 3e-30, 1.0, -2e20], [2e20, 5e-20, 7.0, 3e25],
                                                      [4e25, 2e-25, 3.0, -1e30], [1e20, 1e-20, 2.0, 6e15]))
    exact = ((a1.double() * a2.double()) / (b1.double() * b2.double())).float()
    torch.testing.assert_close(f(a1, a2, b1, b2), exact, rtol=2 ** -23, atol=0)
    assert not torch.isfinite(a1 * a2 / (b1 * b2)).all() and f.report.ops_after["cast"] == 3, f.report


def test_a_common_factor_divides_out_where_it_is_proved_nonzero():
    """x / (y x) is 1/y where x is finite and nonzero (declared here): y x overflows at 1e30 * 1e20 where 1/y is
    1e-20; with x's range reaching 0 (0/0 is NaN there, 1/y is not) the quotient stays as written."""
    x, y = torch.full((64,), 1e30), torch.full((64,), 1e20)
    for spelled in (lambda x, y: x / (y * x), lambda x, y: x / (x * y)):  # the factor on either side of the product
        f = saturate_and_extract(spelled, input_ranges={"x": (1.0, 1e30), "y": (1.0, 1e30)})
        assert (spelled(x, y) == 0).all()
        torch.testing.assert_close(f(x, y), 1 / y, rtol=2 ** -23, atol=0)
        assert f.report.ops_after == {"div": 1}, f.report  # in float32: no float64 form is needed
    g = saturate_and_extract(lambda x, y: x / (y * x), input_ranges={"x": (0.0, 1e30), "y": (1.0, 1e30)})
    zero = torch.zeros(64)
    assert g(zero, y).isnan().all() and all(n != "div-common-factor" for n, _, _ in g.report.rewrites)


def test_a_large_sinh_under_a_logarithm_is_validated_against_long_double():
    """log |sinh x| past |x| = 89 is inf in float32 and finite as |x| - log 2 + log(-expm1(-2|x|)); validation's
    long double reference takes sinh through numpy (sinh declares its numpy form), where float64 overflows past 710:
    the plan is kept, not refused as 'differs from the original's inf'."""
    f = saturate_and_extract(lambda x: torch.log(torch.abs(torch.sinh(x))), input_ranges={"x": (-1e4, 1e4)})
    x = torch.tensor([0.5, -3.0, 100.0, -800.0, 5000.0])
    got = f(x)
    assert f.report.fallback == "" and "log-abs-sinh" in {n for n, _, _ in f.report.rewrites}, f.report
    want = torch.tensor([math.log(math.sinh(0.5)), math.log(math.sinh(3.0)), 100 - math.log(2), 800 - math.log(2),
                         5000 - math.log(2)])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
