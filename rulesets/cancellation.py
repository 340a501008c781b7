"""Cancellation: general rewrites of a difference of two nearly equal values into a form with no
subtraction of rounded operands (Herbie's conjugates, sum-to-product, log algebra), and the
bounded simplification that lets the rewritten terms meet and cancel exactly."""
from . import Exactness, Family, rules, when
from .algebra import NEVER_INF_XY as _FINITE, NEVER_POSITIVE_INF as _BELOW

_E, _A = Family.STABILITY, Family.ALGEBRA
_HALF, _POS = "(const 0.5)", when("(positive ?x)", "(positive ?y)")
_BELOW_Y = _BELOW.rename({"x": "y"})
_BELOW_INF, _SHIFT = _BELOW + _BELOW_Y, when("(> ?c 0.0)", "(positive ?x)", "(> (* (lo ?x) 60000.0) ?c)")
#: +0, or -0 where the left side is -0 (x = -0, y = +0: x - y of zeros): 0x - 0y
_ZERO_SIGN = "(sub (mul ?x (const 0.0)) (mul ?y (const 0.0)))"
_R = "(div (const 1.0) (add (abs ?x) (const 1.0)))"  # 1 / (1 + |x|): scales x y below overflow
_LEAST = 2.0 ** -24  # float16's least subnormal, the dtypes' largest: a real value at least it rounds to no 0 in any

RULES = rules(_E, [
    # -- conjugates: sqrt(a) - sqrt(b) = (a - b) / (sqrt a + sqrt b) ---------------------------
    # name                    lhs                                               rhs
    ("sqrt-shift-difference", "(sub (sqrt (add ?x (const ?c))) (sqrt ?x))",
                              "(div (const ?c) (add (sqrt (add ?x (const ?c))) (sqrt ?x)))", when("(!= ?c 0.0)"),
                              "x + c and x are never both 0 for c != 0: the denominator vanishes nowhere"),
    ("sqrt-opposite-difference", "(sub (sqrt (add ?x (const ?c))) (sqrt (sub (const ?c) ?x)))", "(add (div (mul ?x "
                              "(const 2.0)) (add (sqrt (add ?x (const ?c))) (sqrt (sub (const ?c) ?x)))) (const 0.0))",
                              when(f"(>= ?c {_LEAST!r})", "(< ?c 16384.0)"), "c + x and c - x are 0 together nowhere "
                              "(x = -c makes c - x 2c, no overflow even in float16; c no 0 in any dtype); + 0: at x = -0"),
    ("sqrt-difference-general", "(sub (sqrt ?x) (sqrt ?y))",
                              "(div (sub ?x ?y) (add (sqrt ?x) (sqrt ?y)))",
                              when("(positive ?y)", f"(>= (lo ?y) {_LEAST!r})") + _FINITE,
                              "y at least float16's least subnormal: no 0/0 (positive over the reals is not enough: "
                              "sigmoid(x) rounds to 0 below x = -104 in float32, -18 in float16); both finite: "
                              "no inf/inf"),
    ("sqrt-minus-one",        "(sub (sqrt (add ?x (const 1.0))) (const 1.0))",
                              "(div ?x (add (sqrt (add ?x (const 1.0))) (const 1.0)))", _BELOW,
                              "sqrt(1 + x) - 1 for small x; x below +inf (inf / inf)"),
    # -- differences of reciprocals over a common denominator ----------------------------------
    ("reciprocal-shift-difference", "(sub (div (const 1.0) ?x) (div (const 1.0) (add ?x (const ?c))))",
                              "(div (div (const ?c) ?x) (add ?x (const ?c)))", when("(> ?c 0.0)"),
                              "1/x - 1/(x + c) = c / (x (x + c)), divided twice so x (x + c) cannot overflow"),
    ("reciprocal-difference-general", "(sub (div (const 1.0) ?x) (div (const 1.0) ?y))",
                              "(div (div (sub ?y ?x) (maximum ?x ?y)) (minimum ?x ?y))", _POS + _BELOW_INF,
                              "1/x - 1/y = (y - x)/(x y), divided by the larger first: the quotient is "
                              "within [-1, 1], so only a result past the dtype's max overflows; x, y > 0: "
                              "y - x cannot overflow (max - -max); finite: (y - inf)/inf is no 0 - 1/y"),
    # -- a difference of squares, scaled -------------------------------------------------------
    ("difference-of-squares-times", "(mul (sub (mul ?x ?x) (mul ?y ?y)) ?z)",
                              "(mul (mul (sub (abs ?x) (abs ?y)) ?z) (add (abs ?x) (abs ?y)))",
                              "(x^2 - y^2) z = ((|x| - |y|) z)(|x| + |y|): no rounded squares to cancel "
                              "(x ~ y), and the difference meets z before a square overflows (x = 1e25, "
                              "z = 1e-25); it overflows only where the result does (its magnitude is "
                              "at most |x| + |y|); |x|, |y|: +0 times z's sign where x = +-y, as the left side's"),
    # -- ratios and roots near 1 ------------------------------------------------------------------
    ("ratio-minus-one",       "(sub (div ?x ?y) (const 1.0))",                  "(div (sub ?x ?y) ?y)",
                              _POS + _BELOW_Y, "x/y - 1 = (x - y)/y; x, y > 0: x - y cannot overflow"),
    ("one-minus-ratio",       "(sub (const 1.0) (div ?x ?y))",                  "(div (sub ?y ?x) ?y)",
                              _POS + _BELOW_Y),
    ("sqrt-less-one",         "(sub (sqrt ?x) (const 1.0))",
                              "(div (sub ?x (const 1.0)) (add (sqrt ?x) (const 1.0)))", _BELOW,
                              "conjugate; x below +inf (inf / inf)"),
    ("one-less-sqrt",         "(sub (const 1.0) (sqrt ?x))",
                              "(div (sub (const 1.0) ?x) (add (sqrt ?x) (const 1.0)))", _BELOW),
    # -- cube roots: a - b = (cbrt a - cbrt b)(cbrt a^2 + cbrt a cbrt b + cbrt b^2) --------------
    ("cbrt-difference",       "(sub (cbrt ?x) (cbrt ?y))",
                              "(div (sub ?x ?y) (add (add (mul (cbrt ?x) (cbrt ?x)) (mul (cbrt ?x) (cbrt ?y))) "
                              "(mul (cbrt ?y) (cbrt ?y))))", _POS + _BELOW_INF + when(f"(>= (lo ?y) {_LEAST!r})"),
                              "x, y > 0 (y at least float16's least subnormal: not both rounded to 0): the denominator "
                              "is positive and x - y cannot overflow; finite: no inf/inf"),
    ("cos-minus-one",         "(sub (cos ?x) (const 1.0))",
                              f"(add (mul (const -2.0) (mul (sin (mul ?x {_HALF})) (sin (mul ?x {_HALF})))) (const 0.0))",
                              "cos x - 1 = -2 sin^2(x/2); + 0: +0 at x = 0, as 1 - 1 is"),
    # -- log algebra ---------------------------------------------------------------------------
    ("log-one-minus",         "(log (sub (const 1.0) ?x))",                     "(log1p (neg ?x))"),
    ("log-shift-difference",  "(sub (log (add ?x (const ?c))) (log ?x))",      "(log1p (div (const ?c) ?x))",
                              _SHIFT, "log(x + c) - log(x) = log1p(c / x); c / x <= 6e4: finite in float16"),
    ("log-shift-quotient",    "(log (div (add ?x (const ?c)) ?x))",            "(log1p (div (const ?c) ?x))", _SHIFT),
    ("log-difference-general", "(sub (log ?x) (log ?y))",                      "(log1p (div (sub ?x ?y) ?y))",
                              _POS + when("(<= (hi ?x) (* 60000.0 (lo ?y)))", "(<= (hi ?y) (* 1000.0 (lo ?x)))"),
                              "x, y > 0 within a ratio the ranges bound: (x - y)/y neither overflows nor rounds to -1"),
    # -- expm1 and log1p compositions -----------------------------------------------------------
    ("exp-neg-difference",    "(sub (exp ?x) (exp (neg ?x)))",
                              "(add (sub (expm1 ?x) (expm1 (neg ?x))) (const 0.0))",
                              "e^x - e^-x = expm1(x) - expm1(-x) (2 sinh x); + 0: +0 at x = -0"),
    ("exp-neg-difference-mirror", "(sub (exp (neg ?x)) (exp ?x))",
                              "(add (sub (expm1 (neg ?x)) (expm1 ?x)) (const 0.0))", "-2 sinh x"),
    ("expm1-log1p-cancel",    "(expm1 (log1p ?x))",                            "?x", when("(>= (lo ?x) -1.0)"),
                              "x >= -1: log1p is defined")])

#: sum-to-product, |x|, |y| <= 1e4: (x + y)/2 keeps the argument's digits (at y = 3e38 it moves by
#: ulps of 1e38 radians); they remove the cancellation where x ~ y (the purpose probe "close")
_SMALL = when("(<= (hi ?x) 1e4)", "(>= (lo ?x) -1e4)")
_SMALL += _SMALL.rename({"x": "y"})
RULES += rules(_E, [
    ("tan-difference",        "(sub (tan ?x) (tan ?y))",
                              f"(add (div (sin (sub ?x ?y)) (mul (cos ?x) (cos ?y))) {_ZERO_SIGN})",
                              "tan x - tan y = sin(x - y) / (cos x cos y); + (0x - 0y): the zero's sign"),
    ("sin-difference",        "(sub (sin ?x) (sin ?y))",
                              f"(add (mul (const 2.0) (mul (cos (add (mul ?x {_HALF}) (mul ?y {_HALF}))) "
                              f"(sin (sub (mul ?x {_HALF}) (mul ?y {_HALF}))))) "
                              f"{_ZERO_SIGN})",
                              "sin x - sin y = 2 cos((x+y)/2) sin((x-y)/2), halves first: no "
                              "overflow; + (0x - 0y): the zero's sign of the left (-0 only at -0, +0)"),
    ("cos-difference",        "(sub (cos ?x) (cos ?y))",
                              f"(add (mul (const -2.0) (mul (sin (add (mul ?x {_HALF}) (mul ?y {_HALF}))) "
                              f"(sin (sub (mul ?x {_HALF}) (mul ?y {_HALF}))))) (const 0.0))",
                              "cos x - cos y = -2 sin((x+y)/2) sin((x-y)/2); + 0: +0 at x = y"),
], when=_SMALL)

RULES += rules(_E, [
    ("tanh-difference",       "(sub (tanh ?x) (tanh ?y))",
                              f"(add (mul (tanh (sub ?x ?y)) (sub (const 1.0) (mul (tanh ?x) (tanh ?y)))) {_ZERO_SIGN})",
                              _FINITE, "tanh(x - y) = (tanh x - tanh y) / (1 - tanh x tanh y); finite: "
                              "tanh(inf - inf); + (0x - 0y): 1 - 1 is +0 where tanh(x - y) < 0"),
    ("atan-difference",       "(sub (atan ?x) (atan ?y))",
                              f"(atan2 (mul (sub ?x ?y) {_R}) (add {_R} (mul ?y (mul ?x {_R}))))",
                              _FINITE + when("(> (min (min (* (lo ?x) (lo ?y)) (* (lo ?x) (hi ?y))) "
                                             "(min (* (hi ?x) (lo ?y)) (* (hi ?x) (hi ?y)))) -1.0)"),
                              "atan x - atan y = atan2(x - y, 1 + x y) where x y > -1 (the ranges' least "
                              "product), both scaled by 1 / (1 + |x|) so x y cannot overflow; finite: no inf * 0")])

#: the bounded simplification that lets rewritten terms meet: (x + e) - x is e exactly over the
#: reals; |x| * 0 keeps the shape x broadcasts to, the NaN of an infinite x, and +0 where e = -0
RULES += rules(_A, [
    ("add-sub-cancel",        "(sub (add ?x ?y) ?x)",                          "(add ?y (mul (abs ?x) (const 0.0)))"),
    ("sub-sub-cancel",        "(sub (sub ?x ?y) ?x)",                          "(sub (mul (abs ?x) (const 0.0)) ?y)"),
    # a blend of 1 and w is 1 plus a change: w - 1 meets expm1 (w = e^z) and the sum log1p (truncated exponentials)
    ("blend-with-one",        "(add (sub (const 1.0) ?y) (mul ?y ?w))",         "(add (const 1.0) (mul ?y (sub ?w (const 1.0))))"),
], Exactness.REASSOC)
