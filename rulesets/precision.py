"""Precision mixing: half-precision programs compute in float32 and round once.

Casts are exact over the reals (the float64 reference evaluates them as identities), so each rule is
an identity; the extractor prefers the right sides because every half-precision rounding costs ~11
bits (float16) or ~8 (bfloat16), and a half-precision accumulator loses ~log2(n) more over n terms.
Three moves, each a table:

- accumulate: a reduction or product over half-precision operands runs on float32 copies;
- hoist: an elementwise or layout op of a rounded value runs on the unrounded one, rounding after;
- round trip: widening a value just narrowed from float32 gives the float32 value back.

Together they carry a float32 chain across layers (linear -> relu -> linear ...), so the program
rounds once at its output instead of after every op. Conditions read the e-graph's ``dtype-of``
analysis, recorded for every value whose dtype is set by a cast or a non-float32 leaf.
"""
from egraph_opt.lang.ops import OPS

from . import Family, Rule

HALF = ("float16", "bfloat16")

#: ops whose half-precision form accumulates many terms, with the shapes and attributes their
#: proofs sample
_ACCUMULATING = {name: () for name in ("sum", "mean", "var", "logsumexp", "softmax", "log_softmax")}
_ACCUMULATING.update({
    "matmul": (("x0", (3, 5)), ("x1", (5, 4))),
    "linear": (("x0", (3, 5)), ("x1", (4, 5)), ("x2", (4,))),
    "linear_act": (("x0", (3, 5)), ("x1", (4, 5)), ("x2", (4,)), ("activation", "gelu_tanh")),
    "sdpa": (("x0", (2, 4, 3)), ("x1", (2, 5, 3)), ("x2", (2, 5, 3)), ("scale", 0.5), ("causal", False)),
    "sdpa_masked": (("x0", (2, 4, 3)), ("x1", (2, 5, 3)), ("x2", (2, 5, 3)), ("x3", (4, 5)),
                    ("scale", 0.5)),
    "layer_norm": (("x0", (3, 5)), ("x1", (5,)), ("x2", (5,)), ("eps", 1e-5)),
    "conv2d": (("x0", (2, 3, 6, 6)), ("x1", (4, 3, 3, 3)), ("x2", (4,)), ("stride", "1,1"),
               ("padding", "1,1"), ("dilation", "1,1"), ("groups", 1)),
})
#: one-operand ops whose result on a rounded operand is better computed before rounding, with the
#: attributes (and shapes) their proofs sample
_HOISTED = {name: () for name in ("neg", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "abs",
                                  "sin", "cos", "tanh", "sigmoid", "relu", "erf", "softplus",
                                  "transpose")}
_HOISTED.update({"gelu": (("approximate", "tanh"),), "permute": (("perm", "0,2,3,1"),),
                 "reshape": (("shape", "6,25"),), "expand": (("x", (2, 3, 1, 5)), ("shape", "2,3,4,5")),
                 "slice": (("axis", -1), ("start", 1), ("end", 4), ("step", 2)),
                 "max_pool2d": (("x", (2, 3, 6, 6)), ("kernel", "2,2"), ("stride", "2,2"),
                                ("padding", "0,0"), ("dilation", "1,1"))})
_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")


def _attrs(op: str) -> str:
    return " ".join(f"?{a}" for a, _ in OPS[op].attrs)


def _accumulate(op: str, sample: tuple, dtype: str) -> Rule:
    xs, attrs = [f"?x{i}" for i in range(OPS[op].arity)], _attrs(op)
    wide = " ".join(f'(cast {x} "float32")' for x in xs)
    return Rule(f"{op.replace('_', '-')}-accumulate-float32-{dtype}", f"({op} {' '.join(xs)} {attrs})",
                f'(cast ({op} {wide} {attrs}) "{dtype}")', Family.PRECISION,
                when=(f'(= (dtype-of ?x0) "{dtype}")',), sample=sample,
                why=f"accumulate {dtype} {op} in float32")


def _hoist(op: str, sample: tuple, dtype: str) -> Rule:
    attrs = _attrs(op)
    return Rule(f"{op.replace('_', '-')}-before-rounding-{dtype}", f'({op} (cast ?x "{dtype}") {attrs})',
                f'(cast ({op} ?x {attrs}) "{dtype}")', Family.PRECISION,
                when=('(= (dtype-of ?x) "float32")',), sample=sample,
                why=f"compute {op} before rounding to {dtype}")


def _hoist_binary(op: str, dtype: str, side: int) -> Rule:
    """One operand (``side``) rounded from float32; the other, of the half dtype, widens exactly."""
    lhs = ["?y", "?y"]
    lhs[side] = f'(cast ?x "{dtype}")'
    rhs = ['(cast ?y "float32")', '(cast ?y "float32")']
    rhs[side] = "?x"
    return Rule(f"{op}-{('left', 'right')[side]}-before-rounding-{dtype}", f"({op} {' '.join(lhs)})",
                f'(cast ({op} {" ".join(rhs)}) "{dtype}")', Family.PRECISION,
                when=('(= (dtype-of ?x) "float32")', f'(= (dtype-of ?y) "{dtype}")'),
                why=f"compute {op} before rounding to {dtype}")


RULES = [
    *(_accumulate(op, sample, dtype) for op, sample in _ACCUMULATING.items() for dtype in HALF),
    *(_hoist(op, sample, dtype) for op, sample in _HOISTED.items() for dtype in HALF),
    *(_hoist_binary(op, dtype, side) for op in _BINARY for dtype in HALF for side in (0, 1)),
    *(Rule(f"round-trip-float32-{dtype}", f'(cast (cast ?x "{dtype}") "float32")', "?x",
           Family.PRECISION, when=('(= (dtype-of ?x) "float32")',),
           why=f"widening a value narrowed to {dtype} gives the float32 value back")
      for dtype in HALF),
]
