"""Canonical forms before fusion (issue 17 item 1): a scale moved to the one place fusion rules match it.

Not here, because the extremes test shows them wrong: ``(q / c) @ k^T -> (q @ k^T) / c`` (c > 1: the product overflows
where q / c did not), which needs ranges proved on q and k; and softmax between casts to float32 and back as a
half-precision sdpa (at k = float16's max the left side is NaN; in bfloat16 sdpa's scores round worse): that attention
fuses as sdpa of float32 copies instead (fusion.py, attention-fuse-softmax-float32-*)."""
from . import Family, rules
from .fusion import _SCALED, _SCORES

_C = Family.ALGEBRA  # canonical forms are algebra's business: one family enum, no new tag

RULES = rules(_C, [
    # name                    lhs                                      rhs
    ("transpose-div-out",     "(transpose (div ?x (const ?c)) ?i ?j)", "(div (transpose ?x ?i ?j) (const ?c))",
                              "layout commutes with elementwise scaling"),
    ("transpose-mul-in",      "(mul (transpose ?x ?i ?j) (const ?c))", "(transpose (mul ?x (const ?c)) ?i ?j)",
                              "k^T scaled after its transpose (the dynamo exporter's sqrt(scale) on k)"),
    *((f"bias-after-scores{suffix}", f"(add ?m {s})", f"(add {s} ?m)", "a mask or bias written before the "
       "scores (mask + q k^T c): + commutes exactly") for suffix, s in (("", _SCALED), ("-unscaled", _SCORES)))])
