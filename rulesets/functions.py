"""Elementary functions by their definitions: a naive spelling that overflows or cancels into the
op (or the expm1 / log1p composition) that computes the same value without doing so."""
import math

from . import Exactness, Family, rules, when
from .algebra import F32_MAX, NEVER_INF, NEVER_INF_XY as _FINITE

_E, NEVER_INF_Y = Family.STABILITY, NEVER_INF.rename({"x": "y"})

#: -1 < x < float32's max, at each element (NaN: false): 1 + x > 0 and finite, log1p(x) defined
_BASE_POSITIVE = f"(less (const -1.0) (minimum ?x (sub (const {F32_MAX}) ?x)))"

_YZ = "(maximum (abs ?y) (abs ?z))"
_UM, _VM = f"(div ?u {_YZ})", f"(div ?v {_YZ})"
_SQUARES_M = f"(add (mul (div ?y {_YZ}) (div ?y {_YZ})) (mul (div ?z {_YZ}) (div ?z {_YZ})))"
#: |u|, |v| < 64m and m finite at the element (m * 0 - 1 is -1 for finite m, NaN otherwise): the
#: quotients lie in (-64, 64), so none overflows even in float16, and one underflows only where the
#: result is below 64 times the dtype's least normal number (an absolute error below that number)
_QUOTIENTS_BOUNDED = (f"(less (maximum (sub (maximum (abs ?u) (abs ?v)) (mul {_YZ} (const 64.0))) "
                      f"(sub (mul {_YZ} (const 0.0)) (const 1.0))) (const 0.0))")

_GD = "(add (atan (sinh ?x)) (const 0.0))"  # the Gudermannian, whose difference forms cancel near x = 0
_PI = lambda n: (Exactness.APPROX, when(f"(< (abs (- ?c {math.pi / n!r})) 2e-7)"),  # noqa: E731 - ?c is pi/n as
                 {"sample": (("c", math.pi / n),)})  # float32 (or float64) stores it: a rule's extras
_H = "(hypot ?x ?y)"
_YH, _XH = f"(div ?y {_H})", f"(div ?x {_H})"  # each at most 1 in magnitude (h > 0 where used)

RULES = rules(_E, [
    # name                    lhs                                               rhs
    # -- roots of sums of squares -----------------------------------------------------------------
    ("hypot-fuse",            "(sqrt (add (mul ?x ?x) (mul ?y ?y)))",           "(hypot ?x ?y)",
                              "x^2 + y^2 overflows (x = 1e20) or underflows (1e-25) where hypot does not"),
    ("div-by-sum-of-squares", "(div ?x (add (mul ?y ?y) (mul ?z ?z)))",        "(div (div ?x (hypot ?y ?z)) (hypot ?y ?z))",
                              "x / (y^2 + z^2) = x / h / h, h = hypot(y, z): the sum overflows (1e20) or "
                              "underflows (1e-25) where h does not"),
    ("product-by-sum-of-squares", "(div (mul ?u ?v) (add (mul ?y ?y) (mul ?z ?z)))",
                              f"(where {_QUOTIENTS_BOUNDED} (mul {_UM} (div {_VM} {_SQUARES_M})) "
                              f"(div (mul ?u ?v) (where {_QUOTIENTS_BOUNDED} (const 1.0) (add (mul ?y ?y) (mul ?z ?z)))))",
                              "uv / (y^2 + z^2) = (u/m)((v/m) / s), m = max(|y|, |z|), s = (y/m)^2 + "
                              "(z/m)^2 in [1, 2], where |u|, |v| < 64m (Kahan's (x - y)(x + y) / (x^2 + "
                              "y^2)): the product and the sum overflow (1e20) or underflow (1e-25) where "
                              "the quotients do not; elsewhere the quotient as it was (its sum pinned to "
                              "1 where not taken: a term the left side does not match again)"),
    ("hypot-const",           "(sqrt (add (mul ?x ?x) (const ?c)))",            "(hypot ?x (sqrt (const ?c)))",
                              when("(>= ?c 0.0)"), "sqrt(x^2 + c) for c >= 0, sqrt(c) rounded once"),
    ("quotient-by-square-plus", "(div ?x (add (mul ?x ?x) (const ?c)))",
                              "(div (const 1.0) (add ?x (div (const ?c) ?x)))", when("(> ?c 0.0)"),
                              "x / (x^2 + c) = 1 / (x + c/x): x^2 overflows (x/inf = 0) from |x| = 2e19"),
    # -- a root of a sum of squares plus or less one of them: h -+ x = y^2 / (h +- x), h = hypot(x, y), as
    # (y/h) / (1 +- x/h) y (y/h <= 1, 1 +- x/h in [1, 2]: no overflow) where they cancel (|y| << |x|: a complex
    # square root's real part, a half angle's tangent); elsewhere, and where h is not finite (h - inf is NaN: no
    # comparison holds), the sum as it was, spelled x - (-h) (-x + h): equal in every bit, infinities and NaN too,
    # a term the left side does not match again
    ("hypot-plus-negative",   "(add (hypot ?x ?y) ?x)", f"(where (less (maximum ?x (sub {_H} (const inf))) (const 0.0)) "
                              f"(mul (div {_YH} (sub (const 1.0) {_XH})) ?y) (sub ?x (neg {_H})))",
                              "h + x cancels for x < 0, |y| << |x|"),
    ("hypot-minus",           "(sub (hypot ?x ?y) ?x)", f"(where (less (const 0.0) (minimum ?x (sub (const inf) {_H}))) "
                              f"(mul (div {_YH} (add (const 1.0) {_XH})) ?y) (add (neg ?x) {_H}))",
                              "h - x cancels for x > 0, |y| << x"),
    # -- inverse hyperbolic functions by their logarithms ---------------------------------------
    ("asinh-fuse",            "(log (add ?x (sqrt (add (mul ?x ?x) (const 1.0)))))", "(asinh ?x)", NEVER_INF,
                              "x + sqrt(x^2 + 1) cancels for x << 0 and overflows for x >> 0; "
                              "finite: log(-inf + inf) is NaN where asinh(-inf) is -inf"),
    ("asinh-fuse-abs",        "(log (add (abs ?x) (sqrt (add (mul ?x ?x) (const 1.0)))))", "(asinh (abs ?x))", NEVER_INF,
                              "asinh-fuse at |x| (x^2 = |x|^2), as libm and Rust spell asinh before copysign"),
    ("atanh-fuse",            "(log (div (add ?x (const 1.0)) (sub (const 1.0) ?x)))",
                              "(mul (atanh ?x) (const 2.0))",
                              "(1 + x)/(1 - x) rounds to 1 for tiny x: log gives 0, not 2x"),
    ("atanh-fuse-reciprocal", "(log (div (sub (const 1.0) ?x) (add ?x (const 1.0))))",
                              "(add (mul (atanh ?x) (const -2.0)) (const 0.0))", "atanh-fuse's reciprocal (Proj's forward-v); "
                              "+ 0: +0 at x = 0, as log 1 is"),
    ("log-abs-sinh",          "(log (abs (sinh ?x)))", "(add (sub (abs ?x) (const 0.6931471805599453)) (log (neg (expm1 (mul "
                              "(abs ?x) (const -2.0))))))", Exactness.APPROX, "log |sinh x| = |x| - log 2 + log(1 - e^-2|x|): "
                              "sinh overflows past |x| = 89 (710 in float64) where the logarithm is |x| - log 2"),
    ("tanh-from-logistic",    "(sub (div (const 2.0) (add (exp (mul ?x (const -2.0))) (const 1.0))) (const 1.0))",
                              "(tanh ?x)", "2 sigmoid(2x) - 1 cancels for small x"),
    # -- half angles -------------------------------------------------------------------------------
    ("tan-half-angle",        "(div (sub (const 1.0) (cos ?x)) (sin ?x))",      "(tan (mul ?x (const 0.5)))",
                              "(1 - cos x)/sin x = tan(x/2): 1 - cos x is 0 for |x| < 2^-12"),
    # -- powers minus one through expm1 and log1p ---------------------------------------------
    ("pow-shift-minus-one",   "(sub (pow (add ?x (const 1.0)) ?y) (const 1.0))",
                              "(add (expm1 (mul ?y (log1p ?x))) (const 0.0))", when("(> (lo ?x) -1.0)") + _FINITE,
                              "(1 + x)^y - 1 = expm1(y log1p x) for x > -1; finite: 1^inf is 1, expm1(inf * 0) "
                              "NaN; + 0: +0 at y = 0, as 1 - 1 is"),
    ("pow-minus-one",         "(sub (pow ?x ?y) (const 1.0))",                  "(add (expm1 (mul ?y (log ?x))) (const 0.0))",
                              when("(positive ?x)") + _FINITE, "x^y - 1 = expm1(y log x) for x > 0"),
    ("one-minus-pow",         "(sub (const 1.0) (pow ?x ?y))",                  "(sub (const 0.0) (expm1 (mul ?y (log ?x))))",
                              when("(positive ?x)") + _FINITE, "1 - x^y = -expm1(y log x) for x > 0 (1 - (1 - p)^n, a "
                              "success probability: log(1 - p) meets log1p); 0 - : +0 at x^y = 1, as 1 - 1 is"),
    ("one-minus-pow-at-zero", "(sub (const 1.0) (pow ?x ?y))",                  "(sub (const 0.0) (expm1 (mul ?y (log ?x))))",
                              when("(nonneg ?x)", "(positive ?y)") + _FINITE, "one-minus-pow where x may be 0: for y "
                              "> 0, y log 0 = -inf and -expm1(-inf) = 1 = 1 - 0^y (0^0 = 1 is why y > 0)"),
    # pi/4 and pi/2 as float32 stores them; + 0: +0 at x = -0, as pi/2 - pi/2 is
    ("log-tan-half-angle",    "(log (tan (add (mul ?x (const 0.5)) (const ?c))))", "(add (asinh (tan ?x)) (mul (const 0.0) "
                              "(log (cos ?x))))", *_PI(4), "log tan(pi/4 + x/2), Mercator's, is 1 + x's log: asinh(tan x) "
                              "where cos x > 0, NaN elsewhere as the left side (0 log cos x)"),
    ("log-tan-half-angle-minus", "(log (tan (sub (const ?c) (mul ?x (const 0.5)))))", "(sub (mul (const 0.0) (log "
                              "(cos ?x))) (asinh (tan ?x)))", *_PI(4), "log tan(pi/4 - x/2) = -log tan(pi/4 + x/2)"),
    ("tan-quarter-turn",      "(tan (add (mul ?x (const 0.5)) (const ?c)))", "(where (less (sin ?x) (const 0.0)) (div (cos "
                              "?x) (sub (const 1.0) (sin ?x))) (div (add (const 1.0) (sin ?x)) (cos ?x)))", *_PI(4),
                              "tan(pi/4 + x/2) = (1 + sin x) / cos x = cos x / (1 - sin x), the one whose sum adds like "
                              "signs: x/2 + pi/4 rounds x away near 0 and pi/4 away past 2^25"),
    ("gudermannian",          "(sub (mul (atan (exp ?x)) (const 2.0)) (const ?c))", _GD, *_PI(2), "2 atan(e^x) - pi/2"),
    ("gudermannian-quarter",  "(mul (sub (atan (exp ?x)) (const ?c)) (const 2.0))", _GD, *_PI(4), "2 (atan(e^x) - pi/4)"),
    ("log-coth",              "(log (div (add (exp ?x) (exp (neg ?x))) (sub (exp ?x) (exp (neg ?x)))))",
                              "(log1p (div (const 2.0) (add (expm1 (mul ?x (const 2.0))) (const 0.0))))", NEVER_INF,
                              "log coth x = log(1 + 2 / (e^2x - 1)): the ratio nears 1 and its log cancels (inf / inf past "
                              "x = 89); x finite: NaN at +inf, as the left side; + 0: at x = -0"),
    ("acos-one-minus",        "(acos (sub (const 1.0) ?x))",                     "(add (mul (asin (sqrt (mul ?x (const 0.5)))) "
                              "(const 2.0)) (const 0.0))", when("(nonneg ?x)"), "1 - x cancels near 0 (NaN past 2 either "
                              "way; x >= 0: 1 - x rounds to 1 at x = -1e-38); + 0: +0 at x = -0"),
    ("half-pi-minus-acos",    "(sub (const ?c) (acos ?x))",                      "(add (asin ?x) (const 0.0))", *_PI(2),
                              "pi/2 - acos x cancels near 0"),
    ("pow-shift-minus-one-where", "(sub (pow (add ?x (const 1.0)) ?y) (const 1.0))",
                              f"(where {_BASE_POSITIVE} (add (expm1 (mul ?y (log1p ?x))) (const 0.0)) "
                              f"(sub (pow (where {_BASE_POSITIVE} (const 1.0) (add ?x (const 1.0))) ?y) (const 1.0)))",
                              NEVER_INF_Y, "pow-shift-minus-one where the ranges do not prove x > -1 (x = i/n): "
                              "where() takes it at the elements where -1 < x < float32's max, the power "
                              "elsewhere (its base pinned to 1 where not taken: a term of its own, which the "
                              "left side does not match again); y finite: expm1(inf * 0)")]) + rules(Family.ALGEBRA, [
    ("acos-half-angle",       "(mul (asin (sqrt (mul (sub (const 1.0) ?x) (const 0.5)))) (const 2.0))", "(acos ?x)",
                              "cos x = 1 - 2 sin^2(x/2): acos x, which half-pi-minus-acos meets, and asin is steep near 1")])

#: the quadratic formula's two roots, each in the form whose numerator adds magnitudes: with q = 4ac,
#: (-b +- sqrt(b^2 - q)) / 2a = q / (-b -+ sqrt(b^2 - q)) / 2a (q over it first: at most sqrt|q|). |b| <= 255 and |q| <= 6e4: b^2 and
#: b^2 - q stay finite in float16 (where b^2 overflows, sqrt(inf) / inf gives 0, not -c/b); a != 0:
#: the left side is defined; q != 0: at q = +0 the left side's zero has a's sign, the right side's not
_DISC = "(sqrt (sub (mul ?b ?b) ?q))"
_QUAD = when("(nonzero ?a)", "(nonzero ?q)", "(<= (hi ?q) 60000.0)", "(>= (lo ?q) -60000.0)")
RULES += rules(_E, [
    ("quadratic-plus",        f"(div (add (neg ?b) {_DISC}) (mul ?a (const 2.0)))",
                              f"(div (div ?q (sub (neg ?b) {_DISC})) (mul ?a (const 2.0)))",
                              when("(positive ?b)", "(<= (hi ?b) 255.0)") + _QUAD,
                              "-b + sqrt(b^2 - 4ac) cancels for b > 0 where 4ac is small"),
]) + rules(Family.ALGEBRA, [
    ("quadratic-minus",       f"(div (sub (neg ?b) {_DISC}) (mul ?a (const 2.0)))",
                              f"(div (div ?q (add (neg ?b) {_DISC})) (mul ?a (const 2.0)))",
                              when("(negative ?b)", "(>= (lo ?b) -255.0)") + _QUAD,
                              "-b - sqrt(b^2 - 4ac) cancels for b < 0 where 4ac is small (algebra: no "
                              "purpose probe draws b < 0 beside a small 4ac)")])

#: the numerators -b +- sqrt(b^2 - q) of the two roots, for any b and q: where the two terms cancel (b and the
#: root of one sign, q > -b^2), the conjugate q / (-b -+ sqrt(b^2 - q)) as (q/b) / (-1 -+ sqrt(b^2 - q)/b),
#: which adds magnitudes and stays finite (q/b <= b there); elsewhere the sum as it was. The root scaled by m
#: = max(|b|, 1): m sqrt((b/m)^2 - (q/m)/m) neither overflows (b = 1e20) nor underflows. Both branches are the
#: numerator over the reals, so where() only selects; q = -inf (no real q > -b^2) keeps the sum, whose root is
#: then inf as the left side's. The conjugate + 0: +0 where q = 0, as the sum's b - b is
_M = "(maximum (abs ?b) (const 1.0))"
_ROOT = f"(mul {_M} (sqrt (sub (mul (div ?b {_M}) (div ?b {_M})) (div (div ?q {_M}) {_M}))))"
RULES += rules(_E, [
    ("quadratic-numerator-plus", f"(add (neg ?b) {_DISC})",
                              f"(where (less (const 0.0) (minimum ?b (add ?q (mul ?b ?b)))) "
                              f"(add (div (div ?q ?b) (sub (const -1.0) (div {_ROOT} ?b))) (const 0.0)) (add (neg ?b) {_ROOT}))",
                              "-b + sqrt(b^2 - q) cancels for b > 0 where |q| << b^2, and b^2 overflows "
                              "from |b| = 2e19"),
    ("quadratic-numerator-minus", f"(sub (neg ?b) {_DISC})",
                              f"(where (less (maximum ?b (neg (add ?q (mul ?b ?b)))) (const 0.0)) "
                              f"(add (div (div ?q ?b) (sub (div {_ROOT} ?b) (const 1.0))) (const 0.0)) (sub (neg ?b) {_ROOT}))",
                              "-b - sqrt(b^2 - q) cancels for b < 0 where |q| << b^2")])

#: the same numerators unscaled, a third of the ops (the default objective can afford them), where the ranges bound |b|
#: by 1e19: q / (-b -+ sqrt(b^2 - q)) where b^2 is finite, the sum as it was where b^2 overflows (|b| > 255 in float16),
#: as the left side overflows: inf - b^2 is NaN there, which no comparison holds. Unbounded, the scaled forms: the error
#: estimate, in float64, cannot see float32 take the other branch where b^2 overflows.
_UNSCALED = when("(<= (hi ?b) 1e19)", "(>= (lo ?b) -1e19)")
#: The sum is spelled apart from the left side (the same value, zeros' signs too): a where() over its
#: own e-class is no program an extraction of one e-node per class can take
_SQUARE = "(mul ?b ?b)"
RULES += rules(_E, [
    ("quadratic-numerator-plus-unscaled", f"(add (neg ?b) {_DISC})",
                              f"(where (less (const 0.0) (minimum (minimum ?b (add ?q {_SQUARE})) (sub (const inf) {_SQUARE}))) "
                              f"(add (div ?q (sub (neg ?b) {_DISC})) (const 0.0)) (sub {_DISC} ?b))", _UNSCALED,
                              "-b + sqrt(b^2 - q) cancels for b > 0 where |q| << b^2"),
]) + rules(Family.ALGEBRA, [
    ("quadratic-numerator-minus-unscaled", f"(sub (neg ?b) {_DISC})",
                              f"(where (less (maximum (maximum ?b (neg (add ?q {_SQUARE}))) (sub {_SQUARE} (const inf))) (const 0.0)) "
                              f"(add (div ?q (add (neg ?b) {_DISC})) (const 0.0)) (add (neg ?b) (neg {_DISC})))", _UNSCALED,
                              "-b - sqrt(b^2 - q) cancels for b < 0 where |q| << b^2 (algebra: as "
                              "quadratic-minus, no purpose probe draws b < 0 beside a small q)")])

#: forms to meet: no cancellation the purpose probes can show (acosh's overflow is at x >> 1,
#: where the probes draw both signs; a half angle's other direction cancels only near pi)
RULES += rules(Family.ALGEBRA, [
    ("exp-zero-minus",        "(exp (sub (const 0.0) ?x))",                     "(exp (neg ?x))",
                              "exp(0 - x) = exp(-x): a zero's sign does not reach exp's value"),
    ("acosh-fuse",            "(log (add ?x (sqrt (sub (mul ?x ?x) (const 1.0)))))", "(acosh ?x)",
                              "x^2 - 1 overflows for large x (in float32 near 1 it is nearly exact: "
                              "x^2 of 1 + k 2^-23 rounds off only k^2 2^-46)"),
    ("tan-half-angle-sin",    "(div (sin ?x) (add (cos ?x) (const 1.0)))",      "(tan (mul ?x (const 0.5)))",
                              "sin x / (1 + cos x) = tan(x/2): 1 + cos x cancels near pi")])

#: x -+ sqrt(x^2 - q) is a quadratic's numerator -b -+ sqrt(b^2 - q) at b = -x, exactly ((-x)(-x) is x x): spelled so,
#: the quadratic-numerator rules meet it (Henrywood and Agarwal's x + sqrt(x^2 - M^2), ENA's x - sqrt(x^2 - eps))
_AT = "(sqrt (sub (mul ?x ?x) ?q))", "(neg (neg ?x))", "(sqrt (sub (mul (neg ?x) (neg ?x)) ?q))"
RULES += rules(Family.ALGEBRA, [
    ("root-beside-its-square", f"(add ?x {_AT[0]})",                          f"(add {_AT[1]} {_AT[2]})",
                              "x + sqrt(x^2 - q) as -b + sqrt(b^2 - q), b = -x"),
    ("root-beside-its-square-first", f"(add {_AT[0]} ?x)",                    f"(add {_AT[1]} {_AT[2]})",
                              "sqrt(x^2 - q) + x, as root-beside-its-square"),
    ("root-less-beside-its-square", f"(sub ?x {_AT[0]})",                     f"(sub {_AT[1]} {_AT[2]})",
                              "x - sqrt(x^2 - q) as -b - sqrt(b^2 - q), b = -x")])
