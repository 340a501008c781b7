"""Algebra: canonical forms and identities that let the other families match every spelling."""
from . import Exactness, Family, rules, when

SHIFTED = "(sub ?x (max ?x ?a true))"  # x - max(x): the max-shifted operand of exp
_A = Family.ALGEBRA
#: float32's largest finite and smallest normal magnitudes. A folded constant is a Python float that
#: torch rounds to float32 (a half-precision kernel's scalars are float32 too): a fold is refused
#: where that rounding overflows or underflows, since the unfolded order may not
F32_MAX, F32_TINY = "3.4028234663852886e38", "1.1754943508222875e-38"
NEVER_POSITIVE_INF = when(f"(<= (hi ?x) {F32_MAX})")  # ?x's range is float32's: it does not overflow
NEVER_INF = NEVER_POSITIVE_INF + when(f"(>= (lo ?x) -{F32_MAX})")
NEVER_INF_XY = NEVER_INF + NEVER_INF.rename({"x": "y"})  # ?x, ?y declared finite
#: ?x is never +inf, an input included (its range reaches float32's max: it may hold +inf): for forms shifted by a row's
#: max, which a +inf turns NaN across the row where softmax keeps the naive quotient's 0 at the row's finite entries
BELOW_MAX = when(f"(< (hi ?x) {F32_MAX})")

#: ?c is +-2^k: (1 + 2^-52) |c| - |c| is exactly 2^-52 |c| only where |c|'s significand is 1
POWER_OF_TWO = "(= (- (* (abs ?c) 1.0000000000000002) (abs ?c)) (* (abs ?c) 2.220446049250313e-16))"


def in_float32(expr: str):
    """The constant ``expr`` is a normal float32 (no overflow, no underflow)."""
    return when(f"(< (abs {expr}) {F32_MAX})", f"(>= (abs {expr}) {F32_TINY})")


RULES = rules(_A, [
    # name                    lhs                                rhs
    ("mul-const-right",       "(mul (const ?c) ?x)",             "(mul ?x (const ?c))",
                              "constants on the right: one spelling for fusions to match"),
    ("div-const-to-mul",      "(div ?x (const ?c))",             "(mul ?x (const (/ 1.0 ?c)))",
                              when("(!= ?c 0.0)", POWER_OF_TWO, *in_float32("(/ 1.0 ?c)")), {"sample": (("c", 0.25),)},
                              "x/c = x*(1/c) rounded once, for c a power of two (1/c exact) whose 1/c is a "
                              "normal float32 (x / 1e-39 is not x * inf); x / 3 is not x * 0.33333334"),
    ("add-const-right",       "(add (const ?c) ?x)",             "(add ?x (const ?c))"),
    ("add-negative-const",    "(add ?x (const ?c))",             "(sub ?x (const (- 0.0 ?c)))", when("(< ?c 0.0)"),
                              "the capture's form: a constant added or subtracted is positive"),
    ("sub-negative-const",    "(sub ?x (const ?c))",             "(add ?x (const (- 0.0 ?c)))", when("(< ?c 0.0)")),
    ("cube",                  "(mul (mul ?x ?x) ?x)",            "(pow ?x (const 3.0))"),
    ("transpose-scale-out",   "(transpose (mul ?x (const ?c)) ?i ?j)", "(mul (transpose ?x ?i ?j) (const ?c))"),
    ("reshape-scale-out",     "(reshape (mul ?x (const ?c)) ?s)", "(mul (reshape ?x ?s) (const ?c))",
                              {"sample": (("x", (2, 3, 4)), ("s", "6,4"))}),
    ("mul-one",               "(mul ?x (const 1.0))",            "?x"),
    ("div-one",               "(div ?x (const 1.0))",            "?x"),
    ("add-zero",              "(add ?x (const 0.0))",            "?x", when("(positive ?x)"),
                              "-0 + 0 is +0: only for an x that is never -0 (x - 0 and x * 1 are exact for all x)"),
    ("neg-neg",               "(neg (neg ?x))",                  "?x"),
    ("sub-to-neg",            "(sub (const 0.0) ?x)",            "(neg ?x)", when("(nonzero ?x)"),
                              "0 - (+0) is +0 but -(+0) is -0: only for an x that is never 0"),
    ("pow-two",               "(pow ?x (const 2.0))",            "(mul ?x ?x)"),
    ("square-minus-one",      "(sub (mul ?x ?x) (const 1.0))",   "(add (mul (add ?x (const 1.0)) (sub ?x (const 1.0))) (const 0.0))"),
    ("pow-half",              "(pow ?x (const 0.5))",            "(sqrt ?x)"),
    ("rsqrt-fuse",            "(div (const 1.0) (sqrt ?x))",     "(rsqrt ?x)"),
    ("sqrt-square-abs",       "(sqrt (mul ?x ?x))",              "(abs ?x)"),
    ("exp-log-cancel",        "(exp (log ?x))",                  "?x", when("(positive ?x)")),
    ("div-self",              "(div ?x ?x)",                     "(pow ?x (const 0.0))",
                              when("(nonzero ?x)") + NEVER_INF,
                              "x/x = 1 = x^0, shape kept, for a finite x != 0 (inf/inf is NaN, inf^0 is 1)"),
    ("max-shift-idempotent",  f"(sub {SHIFTED} (max {SHIFTED} ?a true))", SHIFTED,
                              "max(x - max x) is exactly 0: shifting twice is shifting once"),
    ("softmax-shift-invariance", f"(softmax {SHIFTED} ?a)",      "(softmax ?x ?a)"),
    ("log-gather-commute",    "(log (gather ?p ?i ?a))",         "(gather (log ?p) ?i ?a)",
                              "gathering commutes with elementwise ops"),
    # fusions of forms that are already stable into the op that names them
    ("log-sum-exp-from-shifted", f"(add (max ?x ?a true) (log (sum (exp {SHIFTED}) ?a true)))", "(logsumexp ?x ?a true)"),
    ("sigmoid-from-exp",      "(div (const 1.0) (add (exp (neg ?x)) (const 1.0)))", "(sigmoid ?x)"),
    ("variance-fuse",         "(mean (mul (sub ?x (mean ?x ?a true)) (sub ?x (mean ?x ?a true))) ?a ?k)",
                              "(var ?x ?a ?k 0)"),
    ("div-sqrt-to-rsqrt",     "(div ?x (sqrt ?y))",              "(mul ?x (rsqrt ?y))")])

RULES += rules(_A, [  # (q * c) @ k^T is attention scaled first; c > 0 keeps zeros' signs
    ("matmul-scale-left-out", "(matmul (mul ?a (const ?c)) ?b)", "(mul (matmul ?a ?b) (const ?c))"),
    ("matmul-scale-right-out", "(matmul ?a (mul ?b (const ?c)))", "(mul (matmul ?a ?b) (const ?c))"),
], when=when("(> ?c 0.0)"))

RULES += rules(_A, [
    # attention's q k^T / sqrt(d) as the scale sdpa takes (it multiplies by a float32 1/c too)
    ("matmul-div-const-to-mul", "(div (matmul ?a ?b) (const ?c))", "(mul (matmul ?a ?b) (const (/ 1.0 ?c)))",
                              when("(!= ?c 0.0)", *in_float32("(/ 1.0 ?c)")),
                              "x/c as x*(1/c) with 1/c rounded: only for products of matrices (scores), "
                              "where fused attention scales so; div-const-to-mul is exact, for powers of two"),
    ("recip-mul-to-div",      "(mul (div (const 1.0) ?x) ?y)",   "(div ?y ?x)", "rounded once, no overflow of 1/x"),
    ("mul-recip-to-div",      "(mul ?y (div (const 1.0) ?x))",   "(div ?y ?x)", "rounded once, no overflow of 1/x"),
], Exactness.REASSOC) + rules(_A, [
    ("mul-const-fold",        "(mul (mul ?x (const ?a)) (const ?b))", "(mul ?x (const (* ?a ?b)))",
                              "x * 1e30 * 1e30 is not x * inf (0, not NaN, at x = 0)"),
], Exactness.REASSOC, when=in_float32("(* ?a ?b)"))

#: quarantined: wrong for some inputs, kept (never run by default) with the input that shows it
RULES += rules(_A, [
    ("sqrt-square-cancel",    "(sqrt (mul ?x ?x))",              "?x", {"counterexample": (("x", -2.0),)},
                              "sqrt(x^2) = |x|, not x: see sqrt-square-abs"),
    ("div-mul-cancel",        "(mul (div ?x ?y) ?y)",            "?x", {"counterexample": (("x", 1.0), ("y", 0.0))},
                              "undefined at y = 0, and rounds otherwise"),
    ("mul-const-inward",      "(mul (mul ?a ?b) (const ?c))",    "(mul (mul ?a (const ?c)) ?b)",
                              {"counterexample": (("a", 5e-324), ("b", 1e300), ("c", 0.5))},
                              "a * c underflows where a * b does not (a subnormal, b huge): 0, not 2.5e-24"),
    ("log-power-any-sign",    "(log (mul ?x ?x))",               "(mul (log ?x) (const 2.0))",
                              {"counterexample": (("x", -3.0),)}, "needs x > 0: see log-product"),
], Exactness.UNSAFE)

#: f(x) = copysign(f(|x|), x) for an odd f that is >= 0 (or NaN) on [0, inf] and keeps -0 (f(-0) = -0): a
#: function of |x| given x's sign bit, as libm's and Rust's odd functions are spelled, is the function itself
RULES += rules(_A, [(f"{f}-odd", f"(copysign ({f} (abs ?x)) ?x)", f"({f} ?x)",
                     f"{f} is odd and not negative on [0, inf]: copysign({f}(|x|), x) is {f}(x), -0 too")
                    for f in ("asinh", "sinh", "tanh", "atan", "erf", "cbrt")])
