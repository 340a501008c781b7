"""Fusion rewrites: chains of primitive ops into the fused ops kernels implement."""
from . import Family, rules

_SCORES = "(matmul ?q (transpose ?k -2 -1))"

RULES = rules(Family.FUSION, [
    # name                     lhs                                                   rhs
    ("attention-fuse",         f"(matmul (softmax (mul {_SCORES} (const ?c)) -1) ?v)", "(sdpa ?q ?k ?v ?c false)"),
    ("attention-fuse-unscaled", f"(matmul (softmax {_SCORES} -1) ?v)",              "(sdpa ?q ?k ?v 1.0 false)"),
])
