"""Precision mixing: reductions over float16/bfloat16 accumulate in float32.

Widening casts are exact, so each rule is an identity over the reals; the extractor prefers the
right side because a half-precision accumulator loses ~log2(n) bits over n terms. Conditions read
the e-graph's dtype analysis (``dtype-of`` is recorded for every non-float32 value).
"""
from . import Family, Rule

RULES = [
    Rule(f"{op}-accumulate-float32-{dtype}", f"({op} ?x ?a ?k)",
         f'(cast ({op} (cast ?x "float32") ?a ?k) "{dtype}")', Family.PRECISION,
         when=(f'(= (dtype-of ?x) "{dtype}")',),
         why=f"accumulate {dtype} {op} in float32")
    for op in ("sum", "mean") for dtype in ("float16", "bfloat16")
]
