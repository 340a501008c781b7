"""Stability rewrites: naive numerics into forms that stay finite and accurate at extreme inputs."""
from . import Family, rules, when
from .algebra import BELOW_MAX, F32_MAX, F32_TINY, NEVER_INF, SHIFTED as _SHIFTED

_E, _POS = Family.STABILITY, when("(positive ?a)", "(positive ?b)")

RULES = rules(_E, [
    # -- fusions into stable composite ops ------------------------------------------------------
    # name                    lhs                                               rhs
    ("softmax-fuse",          "(div (exp ?x) (sum (exp ?x) ?a true))",          "(softmax ?x ?a)"),
    ("softmax-max-shift",     "(div (exp ?x) (sum (exp ?x) ?a true))",
                              f"(div (exp {_SHIFTED}) (sum (exp {_SHIFTED}) ?a true))", BELOW_MAX,
                              "shift invariance: no exp argument exceeds 0; at x = +inf the shifted form is "
                              "NaN where the naive one is 0 (other entries of the row)"),
    ("log-sum-exp-fuse",      "(log (sum (exp ?x) ?a ?k))",                     "(logsumexp ?x ?a ?k)"),
    ("log-softmax-fuse",      "(log (softmax ?x ?a))",                          "(log_softmax ?x ?a)"),
    ("log-softmax-from-lse",  "(sub ?x (logsumexp ?x ?a true))",                "(log_softmax ?x ?a)",
                              "x - lse(x) cancels at large offsets; log_softmax shifts by max"),
    ("sigmoid-from-exp-ratio", "(div (exp ?x) (add (exp ?x) (const 1.0)))",
                              "(add (sigmoid ?x) (mul (relu ?x) (const 0.0)))",
                              "e^x / (1 + e^x) is inf/inf for large x; + relu(x) * 0 keeps its NaN "
                              "at x = +inf (inf * 0), 0 elsewhere"),
    ("sigmoid-from-exp-ratio-finite", "(div (exp ?x) (add (exp ?x) (const 1.0)))", "(sigmoid ?x)", BELOW_MAX,
                              "x declared below float32's max (an undeclared input ranges up to it and may "
                              "be +inf): no NaN to keep"),
    # two classes' softmax (a pairwise preference, a gate): e^a / (e^a + e^b) = sigmoid(a - b)
    ("sigmoid-of-difference", "(div (exp ?a) (add (exp ?a) (exp ?b)))",
                              "(add (sigmoid (sub ?a ?b)) (mul (relu ?a) (const 0.0)))",
                              "e^a / (e^a + e^b) is inf/inf or 0/0 where the exps overflow or underflow; "
                              "+ relu(a) * 0 keeps its NaN at a = +inf, as sigmoid-from-exp-ratio"),
    ("sigmoid-of-difference-finite", "(div (exp ?a) (add (exp ?a) (exp ?b)))", "(sigmoid (sub ?a ?b))",
                              BELOW_MAX.rename({"x": "a"}), "a declared below float32's max: no NaN to keep"),
    ("softplus-fuse",         "(log1p (exp ?x))",                               "(softplus ?x)"),
    ("log-sigmoid-stable",    "(log (sigmoid ?x))",                             "(sub (const 0.0) (softplus (neg ?x)))",
                              "0 - s, not -s: +0 where softplus underflows, as log(1) is"),
    ("log-one-minus-sigmoid", "(log (sub (const 1.0) (sigmoid ?x)))",           "(sub (const 0.0) (softplus ?x))",
                              "BCE's second term: 1 - sigmoid(x) rounds to 0 for large x"),
    ("one-minus-sigmoid",     "(sub (const 1.0) (sigmoid ?x))",                 "(sigmoid (neg ?x))",
                              "a gate's complement (GRU's 1 - z, a probability's 1 - p) rounds to 0 for large x"),
    ("tanh-from-exp",         "(div (sub (exp ?x) (exp (neg ?x))) (add (exp ?x) (exp (neg ?x))))", "(tanh ?x)"),
    ("logaddexp-fuse",        "(log (add (exp ?a) (exp ?b)))",                  "(logaddexp ?a ?b)"),
    ("nll-log-softmax",       "(log (gather (softmax ?x ?a) ?i ?a))",
                              "(gather (log_softmax ?x ?a) ?i ?a)", "-log(softmax(x))[y]: cross-entropy"),
    ("variance-two-pass",     "(sub (mean (mul ?x ?x) ?a ?k) (mul (mean ?x ?a ?k) (mean ?x ?a ?k)))",
                              "(var ?x ?a ?k 0)", "E[x^2] - E[x]^2 cancels catastrophically"),
    ("sum-compensated",       "(sum ?x ?a ?k)",                                 "(compensated_sum ?x ?a ?k)",
                              "partial sums of values of both signs cancel: 1e8 + 1 - 1e8 = 0"),
    # -- elementary functions near their cancellation points ----------------------------------
    ("log1p-from-log",        "(log (add ?x (const 1.0)))",                     "(log1p ?x)"),
    ("expm1-from-exp",        "(sub (exp ?x) (const 1.0))",                     "(expm1 ?x)"),
    ("one-minus-exp",         "(sub (const 1.0) (exp ?x))",                     "(neg (expm1 ?x))"),
    ("exp-difference",        "(sub (exp ?a) (exp ?b))",                        "(mul (exp ?b) (expm1 (sub ?a ?b)))",
                              when("(< (- (hi ?a) (lo ?b)) 11.0)"),
                              "e^a - e^b cancels when a ~ b; a - b <= 11 keeps expm1 finite in float16 (at "
                              "a = 80, b = -110: 0 * inf) and a, b finite (at a = b = -inf: NaN)"),
    ("one-minus-cos",         "(sub (const 1.0) (cos ?x))",
                              "(mul (const 2.0) (mul (sin (mul ?x (const 0.5))) (sin (mul ?x (const 0.5)))))",
                              "1 - cos x = 2 sin^2(x/2)"),
    *((f"one-minus-{f}-squared", f"(sub (const 1.0) (mul ({f} ?x) ({f} ?x)))", f"(mul ({g} ?x) ({g} ?x))",
       f"1 - {f}^2 x = {g}^2 x: {f} x rounds to +-1 near {at}") for f, g, at in (("cos", "sin", "0"), ("sin", "cos", "pi/2"))),
    ("sqrt-difference",       "(sub (sqrt (add ?x (const 1.0))) (sqrt ?x))",
                              "(div (const 1.0) (add (sqrt (add ?x (const 1.0))) (sqrt ?x)))",
                              "rationalized: no cancellation for large x"),
    ("reciprocal-difference", "(sub (div (const 1.0) ?x) (div (const 1.0) (add ?x (const 1.0))))",
                              "(div (const 1.0) (mul ?x (add ?x (const 1.0))))"),
    ("difference-of-squares", "(sub (mul ?a ?a) (mul ?b ?b))",                  "(add (mul (add ?a ?b) (sub ?a ?b)) (const 0.0))",
                              "+ 0: a zero is +0 as on the left (at a = b = -1 the product is -0)"),
    ("shift-cancel",          "(sub (add ?x (const ?c)) (const ?c))",  "(add ?x (const 0.0))", "x + 1 drops x < 2^-24"),
    # -- exponent and logarithm algebra against overflow --------------------------------------
    ("log-exp-cancel",        "(log (exp ?x))",                                 "?x"),
    ("log1p-expm1-cancel",    "(log1p (expm1 ?x))",                             "?x"),
    ("exp-product",           "(mul (exp ?a) (exp ?b))",                        "(exp (add ?a ?b))",
                              "e^a e^b is inf * 0 when a = -b is large"),
    ("exp-quotient",          "(div (exp ?a) (exp ?b))",                        "(exp (sub ?a ?b))"),
    *((f"div-common-factor{s}", f"(div ?x (mul {a}))", "(div (const 1.0) ?y)", NEVER_INF + when("(nonzero ?x)"),
       "x/(y x) = 1/y for a finite x != 0: y x over- or underflows alone") for s, a in (("", "?y ?x"), ("-left", "?x ?y"))),
    ("div-by-square",         "(div ?x (mul ?y ?y))",                           "(div (div ?x ?y) ?y)",
                              "y*y overflows or underflows where x/y/y does not, x/y only where the result does"),
    ("log-product",           "(log (mul ?a ?b))",                              "(add (log ?a) (log ?b))",
                              _POS, "a*b overflows where log a + log b does not"),
    ("log-power",             "(log (pow ?a (const ?p)))",                      "(mul (log ?a) (const ?p))",
                              when("(positive ?a)", "(> ?p 0.0)"), "p <= 0: log(1) * -2 is -0, log(inf^0) NaN"),
]) + rules(_E, [
    (f"log-quotient{suffix}", "(log (div ?a ?b))",                              "(sub (log ?a) (log ?b))",
                              _POS + when(f"(> (max (- (hi ?a) (* {big} (lo ?b))) (- (* {tiny} (hi ?b)) (lo ?a))) 0.0)")
                              + (when(f'(= (dtype-of ?a) "{dtype}")') if dtype else ()))
    for suffix, dtype, big, tiny in (("", None, F32_MAX, F32_TINY), ("-float16", "float16", 65504.0, 6.103515625e-05))
], sample=(("a", 1e30), ("b", 1e-12)),
    why="a/b overflows or underflows where log a - log b does not; elsewhere the difference only cancels "
        "(near a = b: 1.7% in float16 at a = 10.6, b = 11.6; fuzz seed 1441 at a softmax's dominant "
        "entry), so only where a/b may leave the dtype's range")
