"""Stability rewrites: naive numerics into forms that stay finite and accurate at extreme inputs."""
from . import Family, rules
from .algebra import SHIFTED as _SHIFTED

RULES = rules(Family.STABILITY, [
    # name                    lhs                                        rhs
    ("softmax-fuse",          "(div (exp ?x) (sum (exp ?x) ?a true))",   "(softmax ?x ?a)"),
    ("softmax-max-shift",     "(div (exp ?x) (sum (exp ?x) ?a true))",
                              f"(div (exp {_SHIFTED}) (sum (exp {_SHIFTED}) ?a true))",
                              "shift invariance: no exp argument exceeds 0"),
    ("log-sum-exp-fuse",      "(log (sum (exp ?x) ?a ?k))",              "(logsumexp ?x ?a ?k)"),
    ("log-softmax-fuse",      "(log (softmax ?x ?a))",                   "(log_softmax ?x ?a)"),
    ("log-softmax-from-lse",  "(sub ?x (logsumexp ?x ?a true))",         "(log_softmax ?x ?a)"),
    ("log1p-from-log",        "(log (add (const 1.0) ?x))",              "(log1p ?x)"),
    ("log1p-from-log-right",  "(log (add ?x (const 1.0)))",              "(log1p ?x)"),
    ("expm1-from-exp",        "(sub (exp ?x) (const 1.0))",              "(expm1 ?x)"),
    ("log-exp-cancel",        "(log (exp ?x))",                          "?x"),
])
