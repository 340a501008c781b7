"""bench/fpbench.py: the FPCore translator, Herbie's bits metric, float32 bit-pattern sampling, the
truth, and the suite itself (at least 40 problems, none of Hamming's NMSE ones)."""
import importlib.util
import math
import sys
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
import torch

_spec = importlib.util.spec_from_file_location("fpbench", Path(__file__).parents[1] / "bench" / "fpbench.py")
fb = importlib.util.module_from_spec(_spec)
sys.modules["fpbench"] = fb  # its dataclasses look their module up
_spec.loader.exec_module(fb)

SUITE = fb.problems()
F32 = np.float32


def _problem(name):
    return next(p for p in SUITE if p.name == name)


def _one(text):
    return fb.parse_fpcore(fb.read_sexps(text)[0], "test:inline")


def test_suite_is_public_and_has_no_hamming_problem():
    assert len(SUITE) >= 40
    assert len({p.name for p in SUITE}) == len(SUITE)
    for p in SUITE:
        assert p.source.split(":")[0] in ("FPBench/FPBench", "herbie-fp/herbie"), p.source
        assert not fb.EXCLUDED.search(p.source) and not fb.EXCLUDED.search(p.name), p.name
    with pytest.raises(ValueError, match="Hamming/NMSE"):
        fb.parse_fpcore(fb.read_sexps('(FPCore (x) :name "NMSE example 3.1" (- (sqrt (+ x 1)) (sqrt x)))')[0],
                        "FPBench/FPBench:benchmarks/x.fpcore")
    with pytest.raises(ValueError, match="Hamming/NMSE"):
        fb.parse_fpcore(fb.read_sexps('(FPCore (x) :name "2sqrt" (- (sqrt (+ x 1)) (sqrt x)))')[0],
                        "herbie-fp/herbie:bench/hamming/rearrangement.fpcore")


def test_translator_matches_a_hand_written_float64_formula():
    doppler = _problem("doppler1")  # (let ([t1 (+ 331.4 (* 0.6 T))]) (/ (* (- t1) v) (* (+ t1 u) (+ t1 u))))
    u, v, T = torch.tensor([-50.0, 3.0, 99.0], dtype=torch.float64), torch.tensor([20.0, 700.0, 19000.0],
                            dtype=torch.float64), torch.tensor([-30.0, 0.5, 49.0], dtype=torch.float64)
    t1 = 331.4 + 0.6 * T
    torch.testing.assert_close(fb.translate(doppler, fb.TORCH)(u, v, T), -t1 * v / ((t1 + u) * (t1 + u)),
                               rtol=1e-15, atol=0)
    with mpmath.workprec(200):
        got = fb.translate(doppler, fb.MP)(mpmath.mpf(3), mpmath.mpf(700), mpmath.mpf("0.5"))
    assert float(got) == pytest.approx(-331.7 * 700 / (334.7 * 334.7), rel=1e-15)

    # let* sees earlier bindings, if is a where, constants fold in Python, n-ary ops fold left
    p = _one("(FPCore (x.a) :pre (<= 0 x.a 1) (let* ([a (+ x.a 1)] [b (* a a 2)])"
             " (if (< x.a 1/2) b (- (/ b (sqrt 4)) PI))))")
    x = torch.tensor([0.25, 0.75], dtype=torch.float64)
    want = torch.tensor([2 * 1.25 ** 2, 1.75 ** 2 - math.pi], dtype=torch.float64)
    torch.testing.assert_close(fb.translate(p, fb.TORCH)(x), want, rtol=1e-15, atol=0)
    with mpmath.workprec(100):
        assert float(fb.translate(p, fb.MP)(mpmath.mpf("0.75"))) == pytest.approx(1.75 ** 2 - math.pi, rel=1e-15)


def test_bits_of_error_on_known_pairs():
    one, tiny = F32(1.0), F32(np.finfo(np.float32).smallest_subnormal)
    up = np.nextafter(one, F32(2))
    pairs = [(one, one, 0.0), (up, one, 1.0), (np.nextafter(up, F32(2)), one, math.log2(3)),
             (F32(0.0), F32(-0.0), 0.0), (tiny, -tiny, math.log2(3)), (F32(np.nan), one, 32.0),
             (F32(np.inf), np.finfo(np.float32).max, 1.0)]
    for result, truth, bits in pairs:
        assert fb.bits_error([result], [truth])[0] == pytest.approx(bits), (result, truth)
    assert fb.bits_error([F32(-1.0)], [F32(1.0)])[0] == pytest.approx(math.log2(1 + 2 * 0x3F800000))


def test_truth_rounds_once_to_nearest_even_float32():
    with mpmath.workprec(300):
        assert fb.round_f32(1 + mpmath.ldexp(1, -24)) == 1.0  # a tie goes to even
        assert fb.round_f32(1 + 3 * mpmath.ldexp(1, -24)) == 1 + 2 ** -22
        assert fb.round_f32(mpmath.ldexp(3, -151)) == 2 ** -149  # 0.75 of the least subnormal
        assert fb.round_f32(mpmath.mpf(2) ** 128) == math.inf
        assert fb.round_f32(mpmath.mpf("0.1")) == float(F32(0.1))
    sqrt2 = fb.translate(_one("(FPCore (x) (sqrt x))"), fb.MP)
    assert fb.exact(sqrt2, (F32(2.0),)) == float(F32(math.sqrt(2)))
    assert fb.exact(sqrt2, (F32(-1.0),)) is None  # complex: no truth, the point is skipped
    assert fb.exact(fb.translate(_one("(FPCore (x) (/ 1 x))"), fb.MP), (F32(0.0),)) is None
    # a complex intermediate is undefined too, though fabs would make a real of it (Proj's init-u0)
    assert fb.exact(fb.translate(_one("(FPCore (x) (fabs (sqrt (- x 1))))"), fb.MP), (F32(0.5),)) is None
    assert fb.exact(fb.translate(_one("(FPCore (x) (fabs (sqrt (- x 1))))"), fb.MP), (F32(5.0),)) == 2.0


def test_a_truth_that_settles_wrong_at_every_precision_is_no_truth():
    """Kahan's Monster: q = |y - sqrt(y^2 + 1)| - 1/(y + sqrt(y^2 + 1)) is exactly 0, and the program returns 1 there;
    at any fixed precision q is a rounding residue z below 2^-prec, exp(z) - 1 is 0, and 0 settles. Interval
    arithmetic at the same precision shows the value uncertain: the point is skipped, not scored against 0."""
    monster = _one("(FPCore (y) (let ((q (- (fabs (- y (sqrt (+ (* y y) 1)))) (/ 1 (+ y (sqrt (+ (* y y) 1)))))))"
                   " (let ((z (* q q))) (if (== z 0) 1 (/ (- (exp z) 1) z)))))")
    truth, bounds = fb.translate(monster, fb.MP), fb.translate(monster, fb.MP, intervals=True)
    assert fb.exact(truth, (F32(3.0),)) == 0.0  # what fixed precision settles to
    assert fb.exact(truth, (F32(3.0),), bounds) is None
    sqrt2 = _one("(FPCore (x) (hypot x x))")  # a function interval arithmetic lacks: the settled value stands
    assert fb.exact(fb.translate(sqrt2, fb.MP), (F32(1.0),), fb.translate(sqrt2, fb.MP, intervals=True)) == \
        float(F32(math.sqrt(2)))
    cube = _one("(FPCore (x) (- (* x x x) 1))")
    assert fb.exact(fb.translate(cube, fb.MP), (F32(1.5),), fb.translate(cube, fb.MP, intervals=True)) == 2.375


def test_sampling_covers_bit_patterns_inside_the_box():
    rng = np.random.default_rng(0)
    x = fb.sample_box({"x": (0.0, 1.0)}, 4000, rng)["x"]
    assert x.dtype == np.float32 and (x >= 0).all() and (x <= 1).all()
    assert (x < 1e-3).mean() > 0.85  # most float32 patterns in [0, 1] are tiny: uniform in bits
    assert (x < 1e-30).mean() > 0.2
    y = fb.sample_box({"y": (-2.0, 3.0)}, 4000, rng)["y"]
    assert (y >= -2).all() and (y <= 3).all() and 0.4 < (y < 0).mean() < 0.6


def test_box_comes_from_the_precondition():
    box, tag = fb.box_of(_problem("delta4"))  # (<= 4 x1 3969/625): 6.3504 rounded down to float32
    assert tag == "pre" and box["x1"][0] == 4.0 and Fraction(box["x1"][1]) <= Fraction(3969, 625)
    assert np.nextafter(F32(box["x1"][1]), F32(7)) > 3969 / 625
    box, tag = fb.box_of(_problem("Kahan p9 Example"))  # (and (< 0 x 1) (< y 1)): strict, the floats inside
    below_one, least = float(np.nextafter(F32(1), F32(0))), float(np.nextafter(F32(0), F32(1)))
    assert tag == "partial" and box["x"] == (least, below_one) and box["y"] == (fb.DEFAULT_BOX[0], below_one)
    assert fb.box_of(_problem("Hyperbolic sine")) == ({"x": fb.DEFAULT_BOX}, "default")
    # strict and non-box parts of the precondition filter the sampled points
    floudas = _problem("floudas")  # (and (<= 0 x1 2) (<= 0 x2 3) (<= (+ x1 x2) 2))
    inputs, truth = fb.points(floudas, fb.box_of(floudas)[0], 64, np.random.default_rng(1))
    assert len(truth) == 64 and (inputs["x1"].astype(float) + inputs["x2"] <= 2).all()
    t03 = _problem("test03_nonlin2")  # (< 0 x 1)
    inputs, _ = fb.points(t03, fb.box_of(t03)[0], 64, np.random.default_rng(1))
    assert (inputs["x"] > 0).all() and (inputs["y"] < -0.1).all()
    # bounds past float32's range (lo < -1e308) stay finite: no point holds such a precondition, none is kept
    xlohi = _problem("xlohi (overflows)")
    box, _ = fb.box_of(xlohi)
    assert all(math.isfinite(b) for bounds in box.values() for b in bounds), box
    assert len(fb.points(xlohi, box, 8, np.random.default_rng(1), rounds=2)[1]) == 0


def test_one_problem_end_to_end():
    r = fb.run_problem(_problem("sqrt_add"), 32, 0)
    assert r.n == 32 and r.box == "pre"
    assert r.naive.mean() < 3 and r.optimized.mean() < 3  # 1/(sqrt(x+1)+sqrt(x)): well conditioned
    assert r.wide.mean() < 0.5  # the naive program in float64 rounds once: at most one float32 apart
    assert any(line.startswith("the naive program in float64") for line in fb.summary([r]))


@pytest.mark.parametrize("op, xs, want", [
    ("log2", [8.0, 0.5], [3.0, -1.0]), ("log10", [100.0, 0.001], [2.0, -3.0]),
    ("exp2", [3.0, -1.0], [8.0, 0.5]), ("asinh", [0.0, 1.0], [0.0, math.asinh(1)]),
    ("acosh", [1.0, 2.0], [0.0, math.acosh(2)]), ("atanh", [0.0, 0.5], [0.0, math.atanh(0.5)]),
    ("floor", [-2.5, 2.5], [-3.0, 2.0]), ("ceil", [-2.5, 2.5], [-2.0, 3.0]),
    ("trunc", [-2.5, 2.7], [-2.0, 2.0]), ("round", [-2.5, 0.5, 2.4, 1.5], [-3.0, 1.0, 2.0, 2.0]),
])
def test_new_unary_operators_agree_in_torch_and_mpmath(op, xs, want):
    p = _one(f"(FPCore (x) ({op} x))")  # round is C's: halves away from zero, unlike torch.round
    got = fb.translate(p, fb.TORCH)(torch.tensor(xs, dtype=torch.float64))
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-15, atol=1e-15)
    with mpmath.workprec(200):
        assert [float(fb.translate(p, fb.MP)(mpmath.mpf(x))) for x in xs] == pytest.approx(want, rel=1e-15)


@pytest.mark.parametrize("op, pairs", [
    ("fmod", [((-7.0, 3.0), -1.0), ((7.0, -3.0), 1.0), ((5.5, 2.0), 1.5)]),  # C's: the dividend's sign
    ("fma", [((2.0, 3.0, 1.0), 7.0), ((-1.5, 2.0, 0.5), -2.5)]),
])
def test_new_operators_of_several_operands(op, pairs):
    n = len(pairs[0][0])
    p = _one(f"(FPCore ({' '.join('abc'[:n])}) ({op} {' '.join('abc'[:n])}))")
    for args, want in pairs:
        assert float(fb.translate(p, fb.TORCH)(*(torch.tensor(a, dtype=torch.float64) for a in args))) == want
        with mpmath.workprec(200):
            assert float(fb.translate(p, fb.MP)(*(mpmath.mpf(a) for a in args))) == want


def test_unmappable_problems_are_skipped_with_a_reason():
    suite, skipped = fb.read_suite()
    assert len(suite) >= 600 and {p.name for p in suite} == {p.name for p in SUITE}
    reasons = {why for _, _, why in skipped}
    assert "loop" in reasons and "array or annotated parameter" in reasons
    assert fb.unmapped(_one("(FPCore (x) (while (< i 3) ([i 0 (+ i 1)]) x))")) == "loop"
    assert "cbrt" in fb.unmapped(_one("(FPCore (x) (cbrt x))"))  # torch has no cube root
    assert fb.unmapped(_one("(FPCore (x) (fmod x 2))")) is None


def test_constant_operands_reach_torch_functions_as_tensors():
    # a let-bound constant stays a Python number (sqrt of it is math's); fmax, atan2 and copysign
    # take a tensor for it; a parameter may be named like the module the code calls (T)
    p = _one("(FPCore (x T) (let ([c 4]) (+ (fmax (sqrt c) x) (atan2 1 T) (copysign 1 x) (sin T))))")
    x, t = torch.tensor([1.0, 3.0]), torch.tensor([1.0, -1.0])
    want = torch.maximum(torch.tensor(2.0), x) + torch.atan2(torch.tensor(1.0), t) + 1 + torch.sin(t)
    torch.testing.assert_close(fb.translate(p, fb.TORCH)(x, t), want)
