"""Decompositions (seed 004): fused ops expanded into primitives, so the extractor may choose a decomposed path when
it is cheaper. Stable forms only: softmax expands into its max-shifted form, tanh into sigmoid, never into a form that
overflows where the op does not. Most are the ``-rev`` of a fusion; none contains the op it defines (tested)."""
import math

from . import Family, Rule, reverse, rules, when
from .algebra import BELOW_MAX, NEVER_INF, RULES as _ALGEBRA, SHIFTED as _SHIFTED
from .fusion import RULES as _FUSION

_OF = {r.name: r for r in _FUSION + _ALGEBRA}
_REVERSED = {"gelu-from-erf": {"c": 1 / math.sqrt(2)}, "linear-relu-fuse": {}, "linear-gelu-fuse": {},
             "linear-gelu-tanh-fuse": {}, "linear-fuse": {}}

RULES: list[Rule] = [reverse(_OF[name], Family.DECOMPOSITION, **fixed) for name, fixed in _REVERSED.items()]
RULES.append(reverse(_OF["attention-fuse"], Family.DECOMPOSITION, guard=when(*(  # matmuls broadcast no
    f"(= (axis-size ?q -3) (axis-size ?{x} -3))" for x in "kv"))))  # grouped heads (ops.groups)
RULES.append(reverse(_OF["log-sum-exp-from-shifted"], Family.DECOMPOSITION,
                     guard=NEVER_INF))  # the shifted form is NaN on a row of +-inf
RULES += rules(Family.DECOMPOSITION, [  # the shifted forms are NaN across a row holding +inf
    # name                    lhs                          rhs
    ("softmax-decompose",     "(softmax ?x ?a)", f"(div (exp {_SHIFTED}) (sum (exp {_SHIFTED}) ?a true))"),
    ("log-softmax-decompose", "(log_softmax ?x ?a)", f"(sub {_SHIFTED} (log (sum (exp {_SHIFTED}) ?a true)))"),
], when=BELOW_MAX) + rules(Family.DECOMPOSITION, [
    ("tanh-as-sigmoid",       "(tanh ?x)",
                              "(sub (mul (sigmoid (mul ?x (const 2.0))) (const 2.0)) (const 1.0))",
                              "a difference is +0 at x = -0 where tanh is -0: only for x never 0"),
], when=("(nonzero ?x)",))
