"""The first-order rounding error model: it agrees with float32 errors measured against float64,
ranks every naive form above its stable form, and sees overflow, underflow and exact ops."""
import pytest
import torch

from egraph_opt import capture, optimize, pretty, saturate_and_extract

from egraph_opt.drivers import analyzer
from egraph_opt.extractors import CostModel, Objective
from egraph_opt.extractors.rounding_error import elementwise_bits, far_more_accurate, ordinal, program_error, rounding_error
from egraph_opt.lang.program import Program, leaves
from egraph_opt.analysis.sampling import sample_inputs
from egraph_opt.lang.term import Term, evaluate

X, Y = Term.input("x", (4, 16)), Term.input("y", (4, 16))


def op(name, *args, attrs=()):
    return Term(name, args, attrs)


ONE = Term.const(1.0)
MEAN = (-1, True)
#: (name, naive, stable, declared ranges): the stable form must be estimated at least 8 bits better
PAIRS = [
    ("log1p", op("log", op("add", ONE, X)), op("log1p", X), {"x": (1e-7, 1e-3)}),
    ("expm1", op("sub", op("exp", X), ONE), op("expm1", X), {"x": (-1e-3, 1e-3)}),
    ("softmax", op("div", op("exp", X), op("sum", op("exp", X), attrs=MEAN)),
     op("softmax", X, attrs=(-1,)), {"x": (-200.0, 200.0)}),
    ("variance", op("sub", op("mean", op("mul", X, X), attrs=MEAN),
                    op("mul", op("mean", X, attrs=MEAN), op("mean", X, attrs=MEAN))),
     op("var", X, attrs=(-1, True, 0)), {"x": (1e4, 1.0001e4)}),
    ("sqrt_difference", op("sub", op("sqrt", op("add", X, ONE)), op("sqrt", X)),
     op("div", ONE, op("add", op("sqrt", op("add", X, ONE)), op("sqrt", X))), {"x": (1e3, 1e7)}),
    ("exp_difference", op("sub", op("exp", X), op("exp", Y)),
     op("mul", op("exp", Y), op("expm1", op("sub", X, Y))), {"x": (-1e-2, 1e-2), "y": (-1e-2, 1e-2)}),
]


def estimate(term, ranges):
    return program_error(Program((X, Y), term), ranges)


@pytest.mark.parametrize("name,naive,stable,ranges", PAIRS, ids=[p[0] for p in PAIRS])
def test_every_naive_form_is_estimated_worse_than_its_stable_form(name, naive, stable, ranges):
    before, after = estimate(naive, ranges), estimate(stable, ranges)
    assert before.worst >= 16 and after.worst <= before.worst - 8, (name, before.worst, after.worst)


def measured_bits(term, env):
    """float32 error against float64, in the same units: float32 numbers between them."""
    (low,) = evaluate([term], env)
    (truth,) = evaluate([term], env, reference=True)
    apart = (ordinal(low.double(), torch.float32) - ordinal(truth, torch.float32)).abs()
    return torch.log2(1 + apart.double()).reshape(-1)


@pytest.mark.parametrize("name,naive,stable,ranges", PAIRS, ids=[p[0] for p in PAIRS])
def test_the_estimate_bounds_the_error_float32_makes(name, naive, stable, ranges):
    """First order, summed in absolute value, is an upper estimate: the measured error of almost
    every element is within a bit of it (higher-order terms and float64's own rounding aside)."""
    gen = torch.Generator().manual_seed(1)
    inputs = {"x": ((4, 16), "float32"), "y": ((4, 16), "float32")}
    for _ in range(4):
        env = sample_inputs(inputs, ranges, gen)
        for term in (naive, stable):
            predicted = rounding_error(term, env).bits
            actual = measured_bits(term, env)
            defined = ~predicted.isnan()
            assert (actual[defined] <= predicted[defined] + 1).float().mean() >= 0.95, name


def test_an_infinity_consumed_into_a_finite_result_loses_every_bit():
    naive = PAIRS[2][1]
    env = {"x": torch.full((4, 16), 100.0), "y": torch.zeros(4, 16)}
    assert rounding_error(naive, env).bits.min() == 32
    assert rounding_error(op("softmax", X, attrs=(-1,)), env).bits.max() <= 1


def test_a_result_that_overflows_in_truth_too_has_no_error_to_count():
    product = op("mul", op("exp", X), op("exp", Y))
    env = {"x": torch.full((4, 16), 60.0), "y": torch.full((4, 16), 60.0)}
    assert rounding_error(product, env).bits.isnan().all()  # undefined, as Herbie drops such points: not 0 bits
    env["y"][0] = 1.0  # beside finite results, the mean is theirs only
    bits = rounding_error(product, env).bits
    assert bits[:16].isfinite().all() and bits[:16].max() <= 2 and bits[16:].isnan().all()


def test_a_sum_float64_rounds_too_still_counts_what_float32_lost():
    """(x + 1) - 1 at x ~ 1e-20: float64 drops x as float32 does, yet every digit of the result is
    lost (0 for 2e-20); the sum's error is taken against the exact sum, not float64's."""
    env = {"x": torch.full((4, 16), 3e-20), "y": torch.full((4, 16), -5e-25)}
    assert rounding_error(op("sub", op("add", X, ONE), ONE), env).bits.min() >= 24
    assert rounding_error(op("add", X, Y), env).bits.max() <= 1  # no sum float64 rounds: as before


def test_exact_ops_add_no_error():
    exact = op("neg", op("abs", op("mul", X, Term.const(2.0))))
    assert estimate(exact, {"x": (-1e30, 1e30)}).worst == 0


def test_undefined_results_are_left_out_and_non_float_outputs_refused():
    env = {"x": -torch.rand(4, 16) - 1, "y": torch.zeros(4, 16)}
    assert rounding_error(op("log", X), env).bits.isnan().all()
    x64 = Term.input("x", (3,), "float64")
    with pytest.raises(ValueError, match="half and single precision"):
        rounding_error(op("exp", x64), {"x": torch.ones(3, dtype=torch.float64)})


def test_samples_stay_in_range_draw_both_ends_and_coincide():
    gen = torch.Generator().manual_seed(0)
    env = sample_inputs({"x": ((8, 16), "float32"), "y": ((8, 16), "float32"),
                         "h": ((5,), "float16")}, {"x": (-1.0, 3.0), "y": (-1.0, 3.0)}, gen)
    for v, (lo, hi) in [(env["x"], (-1, 3)), (env["y"], (-1, 3))]:
        assert v.dtype == torch.float32 and v.min() == lo and v.max() == hi
    assert env["h"].dtype == torch.float16 and env["h"].isfinite().all()  # undeclared: its dtype
    close = ((env["x"][2] - env["y"][2]).abs() <= 2 ** -4 * env["x"][2].abs() * 4)
    assert close.all()  # coincident rows: y within a few digits of x


def test_analyzer_shows_which_node_loses_the_digits():
    report = analyzer.curvature(lambda x: torch.log(1 + x), torch.rand(3, 5) * 1e-5)
    add, log = report.nodes
    assert add.op == "add" and add.error_bits > 15 and log.error_bits <= 2
    assert report.error.worst == pytest.approx(max(add.error_bits, log.error_bits), abs=1)
    assert "err bits" in report.table() and "estimated error: worst" in report.table()


def test_no_estimate_through_an_opaque_call():
    def f(x):
        return torch.fft.fft(x).real.exp()
    program, _ = capture(f, (torch.randn(4, 8),))
    assert program.opaque and program_error(program) is None
    assert analyzer.analyze_program(program).error is None


@pytest.mark.parametrize("name,naive,stable,ranges", PAIRS, ids=[p[0] for p in PAIRS])
def test_the_stability_objective_returns_a_program_of_least_estimated_error(name, naive, stable, ranges):
    """The stable form is among the candidates the stability objective re-ranks: what it returns
    is estimated no worse (at points of another seed than the ones it chose with)."""
    result = optimize(Program((X, Y), naive), objective=Objective.STABILITY, input_ranges=ranges)
    (after,) = leaves(result.program.outputs)
    chosen = program_error(Program((X, Y), after), ranges, seed=7)
    assert chosen.worst <= program_error(Program((X, Y), stable), ranges, seed=7).worst + 1, pretty(after)
    assert chosen.worst <= program_error(Program((X, Y), naive), ranges, seed=7).worst - 8, pretty(after)


def test_large_and_half_precision_networks_are_estimated_within_bounds():
    """A float16 conv net with a large activation: fewer Jacobian rows, and an estimate."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 4, 3, padding=1)).half()
    program, _ = capture(net, (torch.randn(2, 3, 64, 64, dtype=torch.float16),))
    found = program_error(program, {program.inputs[0].attrs[0]: (-1.0, 1.0)}, points=1)
    assert found is not None and 0 <= found.mean <= found.worst <= 16


def test_parameters_are_exact_and_take_no_derivative():
    """Batch norm refuses a derivative through its running statistics; weights do not round."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).eval()
    program, _ = capture(net, (torch.randn(2, 3, 8, 8),))
    found = program_error(program, {program.inputs[0].attrs[0]: (-1.0, 1.0)}, points=2)
    assert found is not None and 0 < found.worst < 16


def test_where_float64_itself_overflows_no_digit_survives():
    """Past x = 709 exp overflows float64 too and the naive softmax is NaN there even in float64:
    that is every bit lost, not an undefined point (a float16 CNN's naive log-softmax head once
    won its stability re-ranking as 'no error' that way); a NaN from a domain (log of a negative)
    stays undefined."""
    env = {"x": torch.full((4, 16), 1000.0), "y": torch.zeros(4, 16)}
    assert (rounding_error(PAIRS[2][1], env).bits == 32).all()
    negative = {"x": -torch.ones(4, 16), "y": torch.zeros(4, 16)}
    assert rounding_error(op("log", X), negative).bits.isnan().all()


def test_an_overflow_at_other_elements_leaves_an_undefined_one_undefined():
    """sqrt(x) where x < 0 is undefined whatever another element does: an inf at another element
    (or in a branch where() did not take there) does not make it every bit lost. Before, one
    infinite value anywhere made every NaN count 32 bits, so the quadratic numerator's where() form
    read 24 bits worse than it is, and the stability objective kept the form that cancels."""
    x = torch.full((4, 16), -1.0)
    x[0, :8] = 1000.0
    env = {"x": x, "y": torch.zeros(4, 16)}
    same = op("div", op("exp", X), op("exp", X))  # inf / inf in float64 at x = 1000: NaN
    for compute in (lambda t: rounding_error(t, env).bits.reshape(4, 16), lambda t: elementwise_bits(t, env)):
        for term in (op("mul", op("sqrt", X), same), op("where", op("less", X, ONE), op("sqrt", X), same)):
            bits = compute(term)
            assert bits[1:].isnan().all() and (bits[0, :8] == 32).all(), term


@pytest.mark.parametrize("objective,ranges", [("stability", {"b": (-1e8, 1e8), "q": (1e-3, 1e3)}),
                                                ("balanced", {"b": (-1e8, 1e8), "q": (-1e3, 1e3)})])
def test_the_quadratic_numerator_is_accurate_where_it_cancels(objective, ranges):
    """-b + sqrt(b^2 - q): where b > 0 and |q| << b^2 every digit cancels. Over b in [-1e8, 1e8]
    the stability objective takes a numerator's where() form, and so does the default objective
    (the unscaled form, about 4x the time: the bound is raised so that no machine's latencies
    decide the test)."""
    def numerator(b, q):
        return -b + torch.sqrt(b * b - q)
    b, q = torch.tensor([1e6, 3e4, -2e5, 7.0]), torch.tensor([3.0, 0.5, 10.0, 2.0])
    opt = saturate_and_extract(numerator, objective=objective, input_ranges=ranges, max_slowdown=8)
    out = opt(b, q)
    assert any(name.startswith("quadratic-numerator-plus") for name, _, _ in opt.report.rewrites), opt.report
    b64, q64 = b.double(), q.double()
    root = torch.sqrt(b64 * b64 - q64)
    exact = torch.where(b64 > 0, -q64 / (b64 + root), -b64 + root)  # float64, no cancellation
    torch.testing.assert_close(out.double(), exact, rtol=4 * 2 ** -23, atol=0)
    assert not torch.allclose(numerator(b, q).double(), exact, rtol=1e-3, atol=0)


def _wide(term):
    """``term`` of X computed in float64 from float32 X, rounded once."""
    x64 = op("cast", X, attrs=("float64",))
    made = {id(X): x64}
    def walk(t):
        if id(t) not in made:
            made[id(t)] = op(t.op, *(walk(a) for a in t.args), attrs=t.attrs) if t.args else t
        return made[id(t)]
    return op("cast", walk(term), attrs=("float32",))


def test_a_difference_float64_cancels_counts_float64s_own_rounding():
    """(x + 1) - x computed in float64 from a float32 x ~ 1e20: float64 drops the 1 as float32 would;
    its reference cannot show that, so a float64 sum's own rounding (TwoSum's) is counted."""
    env = {"x": torch.full((4, 16), 3e20)}
    assert rounding_error(_wide(op("sub", op("add", X, ONE), X)), env).bits.min() >= 24
    assert rounding_error(_wide(op("mul", X, Term.const(3.0))), env).bits.max() <= 1  # float64's is no bit of float32's


def test_a_float64_op_exact_in_float32_there_is_exact():
    """1/tanh(x) - 1/tanh(x)^3, times x^3, at x = 1e20: tanh is 1, the difference 0 in every precision (its
    truth, 2e^-2x x^3, underflows). Half a float64 ulp on tanh times the derivative (~x^3) read 32 bits where
    the float64 program is exact; where float32 computes an op exactly, float64 does too."""
    t = op("tanh", X)
    term = op("mul", op("sub", op("div", ONE, t), op("div", ONE, op("mul", t, op("mul", t, t)))),
              op("mul", X, op("mul", X, X)))
    env = {"x": torch.tensor([1e20, -3e25, 40.0])}
    assert rounding_error(_wide(term), env).bits.max() <= 1


def test_a_value_float64_rounds_flat_is_off_by_its_move():
    """exp(x) - 1 at x = 1e-30: exp is 1 in float32 and float64 alike, yet 1e-30 from it, and the difference, 0, loses
    every digit (expm1 keeps them). Taken as exact, exp read 0 bits there, and the stability objective chose
    1 + d (exp(-x) - 1) over d expm1(-x), 1 off at x = 1.2e-38 (fuzz seed 3902000045)."""
    env = {"x": torch.full((4, 16), 1e-30)}
    assert rounding_error(op("sub", op("exp", X), ONE), env).bits.min() >= 24
    assert rounding_error(_wide(op("sub", op("exp", X), ONE)), env).bits.min() >= 24  # float64's exp is flat too
    assert rounding_error(op("expm1", X), env).bits.max() <= 1


@pytest.mark.parametrize("latency, bits, taken", [(220, 8.0, True), (260, 8.0, False), (260, 6.0, True),
                                                  (90, 8.0, True)])
def test_fewer_bits_buy_less_time(latency, bits, taken):
    """(x + 1) - 1 over [0.03, 0.3] is 5 bits off at worst (2 on average), exact in float64: a gain ``g`` under
    ``bits`` buys the time whose ``bits / g``-th power is affordable (4x: 5 of 8 bits buy 2.4x), ``bits`` all of it."""
    naive = op("sub", op("add", X, ONE), ONE)
    ranges = {"x": (0.03, 0.3)}
    programs = [Program((X,), t) for t in (naive, _wide(naive))]
    first, wide = (program_error(p, ranges) for p in programs)
    assert 4.8 < first.worst - wide.worst < 5.3 and first.mean - wide.mean >= 1  # what the bits buy: 2.3x to 2.5x
    model = CostModel(max_slowdown=4.0)
    chosen = far_more_accurate(programs, [100, latency], lambda a, b, g=99: model.affordable(a, b, g * 8 / bits), ranges)
    assert chosen == (1 if taken else None)


def test_bits_at_worst_buy_time_beside_a_bit_on_average_or_a_non_finite_result_made_finite():
    """Bits at worst buy time where the form is also a bit better on average (FPBench's "improved") or makes a
    non-finite result finite. float32 gelu loses every bit only where its value underflows (worst 29.6 bits, 0.3 on
    average): float64's form buys no time under balanced."""
    from egraph_opt.extractors.rounding_error import ProgramError, bits_gained
    exact, tail, nan = ProgramError(0.0, 0.0, {}), ProgramError(29.6, 0.4, {}), ProgramError(32.0, 0.4, {})
    assert bits_gained(tail, exact) == pytest.approx(0.4) and bits_gained(nan, exact) == 32.0
    assert bits_gained(nan, None) == 0.0  # a form not estimable gains nothing
    assert bits_gained(ProgramError(8.0, 8.0, {}), ProgramError(9.0, 0.0, {})) == 8.0  # 8 on average: worse at worst
    assert bits_gained(ProgramError(12.0, 1.5, {}), ProgramError(2.0, 0.5, {})) == 10.0  # a bit on average: the worst
    x = torch.randn(2, 256, 64, generator=torch.Generator().manual_seed(0))
    f = saturate_and_extract(torch.nn.functional.gelu, profile_budget=0)  # no range: every float32 sampled
    torch.testing.assert_close(f(x), torch.nn.functional.gelu(x), rtol=1e-6, atol=1e-7)
    assert f.report.ops_after == {"gelu": 1}, f.report  # not computed in float64


def test_samples_where_both_forms_lose_every_bit_tell_them_not_apart():
    """An attention's bit patterns overflow q @ k in the naive and the fused form alike (32 bits at nearly every point):
    such a sample is no verdict, and conditioning decides (the demo's float32 plan, timed slower under noise, fell
    back to the naive softmax, which overflows at scores of 90)."""
    from egraph_opt.extractors.rounding_error import ProgramError, lost_alike
    naive, fused = ProgramError(32.0, 32.0, {}), ProgramError(32.0, 31.54, {})
    assert lost_alike(naive, fused) and not lost_alike(naive, ProgramError(32.0, 29.0, {}))
    assert not lost_alike(ProgramError(2.0, 0.5, {}), ProgramError(1.0, 0.2, {})) and not lost_alike(naive, None)
    assert lost_alike(ProgramError(16.0, 15.5, {}, 16), ProgramError(16.0, 16.0, {}, 16))  # float16's every bit
