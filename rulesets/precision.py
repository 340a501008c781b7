"""Precision mixing: reductions over float16/bfloat16 accumulate in float32.

Widening casts are exact, so each rule is an identity over the reals; the extractor prefers the
right side because a half-precision accumulator loses ~log2(n) bits over n terms. Conditions read
the e-graph's dtype analysis (``dtype-of`` is recorded for every non-float32 value).
"""
from . import Family, Rule

_ATTRS = {"sum": "?a ?k", "mean": "?a ?k", "var": "?a ?k ?c", "logsumexp": "?a ?k",
          "softmax": "?a", "log_softmax": "?a"}

RULES = [
    Rule(f"{op.replace('_', '-')}-accumulate-float32-{dtype}", f"({op} ?x {attrs})",
         f'(cast ({op} (cast ?x "float32") {attrs}) "{dtype}")', Family.PRECISION,
         when=(f'(= (dtype-of ?x) "{dtype}")',),
         why=f"accumulate {dtype} {op} in float32")
    for op, attrs in _ATTRS.items() for dtype in ("float16", "bfloat16")
]
