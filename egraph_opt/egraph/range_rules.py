"""Range analysis inside the e-graph, as egglog rules.

Every term loaded from a program gets its interval from the Python analysis (``ranges.py``, which knows shapes and has
exp/log). These rules derive intervals for the nodes rewrites create, and the facts guards read (``positive``,
``nonneg``, ``nonzero``), from bounds and the ops' facts. Other analyses record what rules ask of a value: ``dtype-of``
(a value not float32), ``last-dim``, ``rank`` and ``axis-size`` (fusions' shape contracts; sharding splits two operands
together only where both span the axis alike), a reshape's ``reshape-axis`` and ``reshape-part`` (``through_reshape``),
``whole`` (every device holds the value) and ``nonempty`` (no size-0 axis: only then does a reduction's bound follow
from its operand's). ``lo`` merges by max and ``hi`` by min: two sound intervals of one e-class intersect. Tripwires
panic on merges only an unsound rule makes: two different constants or inputs, an empty interval."""
from __future__ import annotations

import itertools
import re

import torch

from ..lang.ops import BINARY_BROADCASTING, OPS, REDUCTIONS, SAME_SHAPE, UNBOUNDED, ops_where

BIG, RULESET, TRIPWIRES = "1e300", "ranges", "tripwires"

DECLARATIONS = f"""
(function lo (Tensor) f64 :merge (max old new))
(function hi (Tensor) f64 :merge (min old new))
(relation positive (Tensor))
(relation nonneg (Tensor))
(relation nonzero (Tensor))
(relation negative (Tensor))
(function dtype-of (Tensor) String :merge old)
(function last-dim (Tensor) i64 :merge old)
(function rank (Tensor) i64 :merge old)
(function axis-size (Tensor i64) i64 :merge old)
(function reshape-axis (Tensor String i64) i64 :merge old)
(function reshape-part (Tensor String i64) String :merge old)
(relation nonempty (Tensor))
(relation whole (Tensor))
(function promoted (String String) String :merge old)
(ruleset {RULESET})
(ruleset {TRIPWIRES})
""" + "\n".join(f'(set (promoted "{a}" "{b}") "{str(torch.promote_types(getattr(torch, a), getattr(torch, b)))[6:]}")'
                for a, b in [*itertools.product(("float32", "float16", "bfloat16"), repeat=2), ("float64",) * 2])
# as torch promotes two tensors; a float64 one beside another dtype is left unrecorded: a Python number's constant is
# float64 and takes its partner's dtype (the rules below)
#: analyses loaded per axis (``engine.py`` loads them once a rule asks)
AXIS_FACTS = frozenset({"axis-size", "reshape-axis", "reshape-part"})
#: what rule guards may ask of an e-class: the analyses declared above
ANALYSES = frozenset(re.findall(r"\((?:function|relation) ([\w-]+) \(Tensor", DECLARATIONS))


def _c(expr: str) -> str:
    """Clamp to +-BIG so no bound is ever inf (and no later subtraction NaN)."""
    return f"(min (max {expr} -{BIG}) {BIG})"


#: relative outward rounding of a bound egglog computes in f64 (rounded to nearest, and exp as a
#: power of a rounded e): two forms of one value, bounded both ways, never meet in an empty interval
OUTWARD = 2.0 ** -40  # ~8000 float64 ulps; also applied to the intervals the Python analysis loads


def _lo(expr: str) -> str:
    return _c(f"(- {expr} (* (abs {expr}) {OUTWARD!r}))")


def _hi(expr: str) -> str:
    return _c(f"(+ {expr} (* (abs {expr}) {OUTWARD!r}))")


def _operand_pattern(op: str, vars_: str = "abcdfgh") -> str:
    spec = OPS[op]
    args = " ".join(["?" + v for v in vars_[:spec.arity]] + ["?_" + n for n, _ in spec.attrs])
    return f"({spec.egg_name} {args})"


#: bounds of constants and of the arithmetic egglog's f64 can compute, then the sign facts that
#: follow from bounds and from combinations (over the reals)
_ARITHMETIC = [
    "(rule ((= e (Const c))) ((set (lo e) c) (set (hi e) c)))",
    f"(rule ((= e (Add a b)) (= x (lo a)) (= y (lo b))) ((set (lo e) {_lo('(+ x y)')})))",
    f"(rule ((= e (Add a b)) (= x (hi a)) (= y (hi b))) ((set (hi e) {_hi('(+ x y)')})))",
    f"(rule ((= e (Sub a b)) (= x (lo a)) (= y (hi b))) ((set (lo e) {_lo('(- x y)')})))",
    f"(rule ((= e (Sub a b)) (= x (hi a)) (= y (lo b))) ((set (hi e) {_hi('(- x y)')})))",
    "(rule ((= e (Neg a)) (= x (hi a))) ((set (lo e) (neg x))))",
    "(rule ((= e (Neg a)) (= x (lo a))) ((set (hi e) (neg x))))",
    "(rule ((= e (Mul a b)) (= p (lo a)) (= q (hi a)) (= r (lo b)) (= s (hi b))) ("
    f"(set (lo e) {_lo('(min (min (* p r) (* p s)) (min (* q r) (* q s)))')}) "
    f"(set (hi e) {_hi('(max (max (* p r) (* p s)) (max (* q r) (* q s)))')})))",
    f"(rule ((= e (Exp a)) (= x (lo a))) ((set (lo e) {_lo('(^ 2.718281828459045 x)')})))",
    f"(rule ((= e (Exp a)) (= x (hi a))) ((set (hi e) {_hi('(^ 2.718281828459045 x)')})))",
    "(rule ((= e (Relu a)) (= x (lo a))) ((set (lo e) (max x 0.0))))",
    "(rule ((= e (Relu a)) (= x (hi a))) ((set (hi e) (max x 0.0))))",
    # of an operand negative throughout, NaN: no bound (claiming [0, 0] clashed with the
    # bounds another form of the same e-class proved)
    "(rule ((= e (Sqrt a)) (= x (hi a)) (>= x 0.0)) ((set (hi e) (^ x 0.5))))",
    "(rule ((= e (Sqrt a)) (= x (lo a)) (= y (hi a)) (>= y 0.0)) ((set (lo e) (^ (max x 0.0) 0.5))))",
    "(rule ((= e (Rsqrt a)) (= x (lo a)) (= y (hi a)) (> x 0.0)) "
    "((set (lo e) (^ y -0.5)) (set (hi e) (^ x -0.5))))",
    # a quotient by a divisor of one sign (egglog's f64 division panics at 0: guarded)
    *(f"(rule ((= e (Div a b)) (= p (lo a)) (= q (hi a)) (= r (lo b)) (= s (hi b)) {sign}) ("
      f"(set (lo e) {_lo('(min (min (/ p r) (/ p s)) (min (/ q r) (/ q s)))')}) "
      f"(set (hi e) {_hi('(max (max (/ p r) (/ p s)) (max (/ q r) (/ q s)))')})))"
      for sign in ("(> r 0.0)", "(< s 0.0)")),
    # log has no f64 primitive: 1 - 1/x <= log x <= x - 1, and |log x| <= 745 for any finite
    # f64 (an operand bounded by BIG only may be +inf, whose log is: no upper bound then)
    "(rule ((= e (Log a)) (= x (lo a)) (> x 0.0)) ((set (lo e) (max (- 1.0 (/ 1.0 x)) -745.0))))",
    f"(rule ((= e (Log a)) (= x (hi a)) (> x 0.0) (< x {BIG})) ((set (hi e) (min (- x 1.0) 710.0))))",
    "(rule ((= e (Log1p a)) (= x (lo a)) (> x -1.0)) ((set (lo e) (max (- 1.0 (/ 1.0 (+ x 1.0))) -745.0))))",
    f"(rule ((= e (Log1p a)) (= x (hi a)) (> x -1.0) (< x {BIG})) ((set (hi e) (min x 710.0))))",
    f"(rule ((= e (Expm1 a)) (= x (hi a))) ((set (lo e) -1.0) (set (hi e) {_hi('(^ 2.718281828459045 x)')})))",
    f"(rule ((= e (Softplus a)) (= x (hi a))) ((set (lo e) 0.0) (set (hi e) {_hi('(+ (max x 0.0) 0.7)')})))",
    "(rule ((= e (Softplus a))) ((set (lo e) 0.0)))",
    f"(rule ((= e (Logaddexp a b)) (= x (hi a)) (= y (hi b))) ((set (hi e) {_hi('(+ (max x y) 0.7)')})))",
    "(rule ((= e (Logaddexp a b)) (= x (lo a)) (= y (lo b))) ((set (lo e) (max x y))))",
    "(rule ((= e (LogSoftmax a ?_axis))) ((set (hi e) 0.0)))",
    "(rule ((= e (Logsumexp a ?_axis ?_keep)) (= x (lo a)) (nonempty a)) ((set (lo e) x)))",
    f"(rule ((= e (Logsumexp a ?_axis ?_keep)) (= x (hi a))) ((set (hi e) {_hi('(+ x 44.0)')})))",
    "(rule ((= e (Abs a)) (= x (lo a)) (= y (hi a))) ((set (lo e) 0.0) (set (hi e) (max (abs x) (abs y)))))",
    "(rule ((= e (Maximum a b)) (= x (lo a)) (= y (lo b))) ((set (lo e) (max x y))))",
    "(rule ((= e (Maximum a b)) (= x (hi a)) (= y (hi b))) ((set (hi e) (max x y))))",
    "(rule ((= e (Minimum a b)) (= x (lo a)) (= y (lo b))) ((set (lo e) (min x y))))",
    "(rule ((= e (Minimum a b)) (= x (hi a)) (= y (hi b))) ((set (hi e) (min x y))))",
    # facts from bounds
    "(rule ((= x (lo e)) (> x 0.0)) ((positive e)))",
    "(rule ((= x (lo e)) (>= x 0.0)) ((nonneg e)))",
    "(rule ((= x (hi e)) (< x 0.0)) ((negative e) (nonzero e)))",
    "(rule ((positive e)) ((nonneg e) (nonzero e)))",
    # facts of combinations (over the reals)
    "(rule ((= e (Add a b)) (positive a) (nonneg b)) ((positive e)))",
    "(rule ((= e (Add a b)) (nonneg a) (positive b)) ((positive e)))",
    "(rule ((= e (Add a b)) (nonneg a) (nonneg b)) ((nonneg e)))",
    "(rule ((= e (Mul a b)) (positive a) (positive b)) ((positive e)))",
    "(rule ((= e (Mul a b)) (nonneg a) (nonneg b)) ((nonneg e)))",
    "(rule ((= e (Mul a a))) ((nonneg e)))",
    "(rule ((= e (Mul a b)) (nonzero a) (nonzero b)) ((nonzero e)))",
    "(rule ((= e (Div a b)) (positive a) (positive b)) ((positive e)))"]


def _dtype_and_rank_rules():
    """What shape contracts and precision rules read: last-dim, rank and dtype-of through ops."""
    yield '(rule ((= e (Cast x d))) ((set (dtype-of e) d)))'
    for op in SAME_SHAPE:  # last-dim, and rank: (1 + w) is a weight of rank 1 as w is
        yield f"(rule ((= e {_operand_pattern(op)}) (= n (last-dim ?a))) ((set (last-dim e) n)))"
        yield f"(rule ((= e {_operand_pattern(op)}) (= n (rank ?a))) ((set (rank e) n)))"
    # where: a bool first operand; compare: a bool result; broadcast: promotes (below)
    for op in ops_where(lambda op: op.shape_rule not in ("cast", "where", "compare", "broadcast")):
        agree = " (= d (dtype-of ?d))" if op == "linear_add" else ""  # its residual promotes: where x's agrees
        yield f"(rule ((= e {_operand_pattern(op)}) (= d (dtype-of ?a)){agree}) ((set (dtype-of e) d)))"
    for op in BINARY_BROADCASTING:  # (rotary's three operands leave its rank and dtype unrecorded:
        # a guard or precision rule then does not fire on it). The dtype promotes as torch's does (float16 + float32
        # is float32: a half-precision mask added to float32 scores), or is a scalar const's partner's
        yield f"(rule ((= e {_operand_pattern(op)}) (= n (rank ?a)) (= m (rank ?b))) ((set (rank e) (max n m))))"
        name, attrs = OPS[op].egg_name, " ".join("?_" + n for n, _ in OPS[op].attrs)
        for args, known in (("?a ?b", "(= d (promoted (dtype-of ?a) (dtype-of ?b)))"),
                            ("?a (Const ?c)", "(= d (dtype-of ?a))"), ("(Const ?c) ?b", "(= d (dtype-of ?b))")):
            yield f"(rule ((= e ({name} {args} {attrs})) {known}) ((set (dtype-of e) d)))"


def _op_fact_rules():
    """Bounds, signs and wholeness that the op table declares once per op."""
    for op in ops_where(lambda op: op.range_rule in ("operand", "values")):  # within the operand's values
        query = f"(= e {_operand_pattern(op)})" + " (nonempty ?a)" * (op in REDUCTIONS)
        yield f"(rule ({query} (= x (lo ?a))) ((set (lo e) x)))"
        yield f"(rule ({query} (= x (hi ?a))) ((set (hi e) x)))"
    # exactly the operand's values: its interval is the result's too (a rewrite may create the
    # operand below a loaded result: a float32 value under a cast)
    for op in ops_where(lambda op: op.range_rule == "values"):
        pattern = _operand_pattern(op)
        yield f"(rule ((= e {pattern}) (= x (lo e))) ((set (lo ?a) x)))"
        yield f"(rule ((= e {pattern}) (= x (hi e))) ((set (hi ?a) x)))"
    for op in ops_where(lambda op: op.bounds != UNBOUNDED):
        lo, hi = OPS[op].bounds
        yield f"(rule ((= e {_operand_pattern(op)})) ((set (lo e) {lo}) (set (hi e) {hi})))"
    for op in ops_where(lambda op: op.sign != "any"):
        yield f"(rule ((= e {_operand_pattern(op)})) (({OPS[op].sign} e)))"
    # ``whole``: every device of a mesh holds the same value (lang/mesh.py); a shard's and a
    # reduce-scatter's results are parts, and an op over parts is too
    for name, op in OPS.items():
        if op.mesh != "parts":
            operands = "" if op.mesh else "".join(f" (whole ?{v})" for v in "abcdfgh"[:op.arity])
            yield f"(rule ((= e {_operand_pattern(name)}){operands}) ((whole e)))"


def rules() -> list[str]:
    return [r[:-1] + f" :ruleset {RULESET})" for r in [*_ARITHMETIC, *_dtype_and_rank_rules(), *_op_fact_rules()]]


def tripwires() -> list[str]:
    return [f"(rule {query} ((panic \"{message}\")) :ruleset {TRIPWIRES})" for query, message in [
        ("((= (Const a) (Const b)) (!= a b))", "tripwire: two different constants merged"),
        ("((= (Input n s d) (Input m t f)) (!= n m))", "tripwire: two different inputs merged"),
        ("((= (Input n s d) (Input m t f)) (!= d f))", "tripwire: two dtypes merged"),
        ("((= x (lo e)) (= y (hi e)) (> x (+ y (+ 1e-9 (* 1e-9 (abs y))))))",
         "tripwire: empty range (an unsound merge)")]]
