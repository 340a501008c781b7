"""Precision mixing: half-precision programs compute in float32 and round once.

Casts are exact over the reals (the float64 reference evaluates them as identities), so each rule is an identity; the
extractor prefers the right sides because every half-precision rounding costs ~11 bits (float16) or ~8 (bfloat16), and
a half-precision accumulator loses ~log2(n) more over n terms. Three moves, read from the op table (``Op.precision``):

- accumulate: a reduction or product over half-precision operands runs on float32 copies;
- hoist: an elementwise or layout op of a rounded value runs on the unrounded one, rounding after;
- round trip: widening a value just narrowed from float32 gives the float32 value back.

Together they carry a float32 chain across layers (linear -> relu -> linear ...), so the program rounds once at its
output instead of after every op. Conditions read the e-graph's ``dtype-of`` (set by casts and non-float32 leaves)."""
from egraph_opt.lang.ops import OPS

from . import Family, rules, when

HALF = ("float16", "bfloat16")

#: what each op declares it does in half precision (``Op.precision``), with the shapes and
#: attributes its proofs sample (``Op.sample``)
_ACCUMULATING = [op for op in OPS.values() if op.precision == "accumulate"]
_HOISTED = [op for op in OPS.values() if op.precision == "hoist" and op.arity == 1]
_HOISTED_BINARY = [op.name for op in OPS.values() if op.precision == "hoist" and op.arity == 2]
_FLOAT32 = when('(= (dtype-of ?x) "float32")')


def _accumulate(op: str, sample: tuple, dtype: str) -> tuple:
    wide = "".join(f' (cast ?x{i} "float32")' for i in range(OPS[op].arity))
    return (f"{op.replace('_', '-')}-accumulate-float32-{dtype}", OPS[op].reference,
            f'(cast ({op}{wide}{OPS[op].attr_vars}) "{dtype}")', when(f'(= (dtype-of ?x0) "{dtype}")'), {"sample": sample},
            f"accumulate {dtype} {op} in float32")


def _hoist(op: str, sample: tuple, dtype: str) -> tuple:
    attrs = OPS[op].attr_vars
    return (f"{op.replace('_', '-')}-before-rounding-{dtype}", f'({op} (cast ?x "{dtype}"){attrs})',
            f'(cast ({op} ?x{attrs}) "{dtype}")', _FLOAT32, {"sample": sample},
            f"compute {op} before rounding to {dtype}")


def _hoist_binary(op: str, dtype: str, side: int) -> tuple:
    """One operand (``side``) rounded from float32; the other, of the half dtype, widens exactly."""
    order = slice(None, None, -1 if side else 1)  # the rounded operand first, or second
    lhs, rhs = [f'(cast ?x "{dtype}")', "?y"][order], ["?x", '(cast ?y "float32")'][order]
    return (f"{op}-{('left', 'right')[side]}-before-rounding-{dtype}", f"({op} {' '.join(lhs)})",
            f'(cast ({op} {" ".join(rhs)}) "{dtype}")', _FLOAT32 + when(f'(= (dtype-of ?y) "{dtype}")'),
            f"compute {op} before rounding to {dtype}")


RULES = rules(Family.PRECISION, [
    *(_accumulate(op.name, op.sample, dtype) for op in _ACCUMULATING for dtype in HALF),
    *(_hoist(op.name, tuple(("x" if v == "x0" else v, x) for v, x in op.sample), dtype)
      for op in _HOISTED for dtype in HALF),
    *(_hoist_binary(op, dtype, side) for op in _HOISTED_BINARY for dtype in HALF for side in (0, 1)),
    *((f"round-trip-float32-{dtype}", f'(cast (cast ?x "{dtype}") "float32")', "?x", _FLOAT32,
       f"widening a value narrowed to {dtype} gives the float32 value back") for dtype in HALF)])
