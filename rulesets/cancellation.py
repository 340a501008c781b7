"""Cancellation: general rewrites of a difference of two nearly equal values into a form with no
subtraction of rounded operands (Herbie's conjugates, sum-to-product, log algebra), and the
bounded simplification that lets the rewritten terms meet and cancel exactly.

Each stability rule's purpose is checked in the tests: at an offset or tiny input in float32 its
right side is accurate where its left side cancels.
"""
from . import Exactness, Family, Rule, rules
from .algebra import F32_MAX, NEVER_INF

_E, _A = Family.STABILITY, Family.ALGEBRA
_FINITE = NEVER_INF + tuple(f.replace("?x", "?y") for f in NEVER_INF)  # ?x, ?y declared finite
_HALF = "(const 0.5)"

RULES = rules(_E, [
    # -- conjugates: sqrt(a) - sqrt(b) = (a - b) / (sqrt a + sqrt b) ---------------------------
    # name                    lhs                                               rhs
    Rule("sqrt-shift-difference", "(sub (sqrt (add ?x (const ?c))) (sqrt ?x))",
         "(div (const ?c) (add (sqrt (add ?x (const ?c))) (sqrt ?x)))", _E, when=("(!= ?c 0.0)",),
         why="x + c and x are never both 0 for c != 0: the denominator vanishes nowhere"),
    Rule("sqrt-difference-general", "(sub (sqrt ?x) (sqrt ?y))",
         "(div (sub ?x ?y) (add (sqrt ?x) (sqrt ?y)))", _E, when=("(positive ?y)",) + _FINITE,
         why="y > 0: no 0/0; both finite: no inf/inf"),
    Rule("sqrt-minus-one",    "(sub (sqrt (add ?x (const 1.0))) (const 1.0))",
         "(div ?x (add (sqrt (add ?x (const 1.0))) (const 1.0)))", _E, when=NEVER_INF[:1],
         why="sqrt(1 + x) - 1 for small x; x below +inf (inf / inf)"),
    # -- differences of reciprocals over a common denominator ----------------------------------
    Rule("reciprocal-shift-difference", "(sub (div (const 1.0) ?x) (div (const 1.0) (add ?x (const ?c))))",
         "(div (div (const ?c) ?x) (add ?x (const ?c)))", _E, when=("(> ?c 0.0)",),
         why="1/x - 1/(x + c) = c / (x (x + c)), divided twice so x (x + c) cannot overflow"),
    ("cos-minus-one",         "(sub (cos ?x) (const 1.0))",
                              f"(add (mul (const -2.0) (mul (sin (mul ?x {_HALF})) (sin (mul ?x {_HALF})))) (const 0.0))",
                              "cos x - 1 = -2 sin^2(x/2); + 0: +0 at x = 0, as 1 - 1 is"),
    # -- log algebra ---------------------------------------------------------------------------
    ("log-one-minus",         "(log (sub (const 1.0) ?x))",                     "(log1p (neg ?x))"),
    # -- expm1 and log1p compositions -----------------------------------------------------------
    ("exp-neg-difference",    "(sub (exp ?x) (exp (neg ?x)))",
                              "(add (sub (expm1 ?x) (expm1 (neg ?x))) (const 0.0))",
                              "e^x - e^-x = expm1(x) - expm1(-x) (2 sinh x); + 0: +0 at x = -0"),
    Rule("expm1-log1p-cancel", "(expm1 (log1p ?x))",                            "?x", _E,
         when=("(>= (lo ?x) -1.0)",), why="x >= -1: log1p is defined"),
])

#: sum-to-product, |x|, |y| <= 1e4: (x + y)/2 keeps the argument's digits (at y = 3e38 it moves by
#: ulps of 1e38 radians). Algebra, not stability: they remove a cancellation only where x ~ y,
#: which the generated purpose probes never draw; they let sin/cos differences meet others
_SMALL = tuple(f"({op} ({b} ?{v}) {s}1e4)" for v in "xy" for op, b, s in (("<=", "hi", ""), (">=", "lo", "-")))
RULES += rules(_A, [
    ("sin-difference",        "(sub (sin ?x) (sin ?y))",
                              f"(add (mul (const 2.0) (mul (cos (add (mul ?x {_HALF}) (mul ?y {_HALF}))) "
                              f"(sin (sub (mul ?x {_HALF}) (mul ?y {_HALF}))))) "
                              "(sub (mul ?x (const 0.0)) (mul ?y (const 0.0))))",
                              "sin x - sin y = 2 cos((x+y)/2) sin((x-y)/2), halves first: no "
                              "overflow; + (0x - 0y): the zero's sign of the left (-0 only at -0, +0)"),
    ("cos-difference",        "(sub (cos ?x) (cos ?y))",
                              f"(add (mul (const -2.0) (mul (sin (add (mul ?x {_HALF}) (mul ?y {_HALF}))) "
                              f"(sin (sub (mul ?x {_HALF}) (mul ?y {_HALF}))))) (const 0.0))",
                              "cos x - cos y = -2 sin((x+y)/2) sin((x-y)/2); + 0: +0 at x = y"),
], when=_SMALL)

#: the bounded simplification that lets rewritten terms meet: (x + e) - x is e exactly over the
#: reals; |x| * 0 keeps the shape x broadcasts to, the NaN of an infinite x, and +0 where e = -0
RULES += rules(_A, [
    ("add-sub-cancel",        "(sub (add ?x ?y) ?x)",                          "(add ?y (mul (abs ?x) (const 0.0)))"),
    ("sub-sub-cancel",        "(sub (sub ?x ?y) ?x)",                          "(sub (mul (abs ?x) (const 0.0)) ?y)"),
], Exactness.REASSOC)
