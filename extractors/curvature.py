"""Curvature: per-op conditioning over value ranges: kappa (kappa_exp = e^(2 hi), kappa_log = 1/lo^2, kappa_div =
1/|d|^3, linear ops 0), L (largest |derivative|), Delta (unit roundoff times the result's largest magnitude).

``kappa_cost`` is led by the float32 error that follows: decibels of the condition numbers that amplify an operand's
rounding error (exp: |x|, log: 1/|log u|), and the all-digits class where no digit survives (cancellation,
amplification past 1 / unit roundoff, an infinity consumed). Bounded kappa only breaks ties; unbounded, it is ordered
by growth class (exponential > singular > bounded > linear), so a stable form still ranks below its naive form."""
from __future__ import annotations

import math

import torch

from egraph_opt.analysis.ranges import Interval, gap, mag
from egraph_opt.lang.ops import OPS

_FINFO = {d: torch.finfo(getattr(torch, d)) for d in ("float64", "float32", "float16", "bfloat16")}
UNIT_ROUNDOFF, FINITE_MAX = {d: f.eps / 2 for d, f in _FINFO.items()}, {d: f.max for d, f in _FINFO.items()}


def _exp(v: float) -> float:
    return math.exp(v) if v < 700 else math.inf


def _pow(attrs: tuple, operands: list[Interval]) -> float:
    p = operands[1][1] if operands[1][0] == operands[1][1] else math.inf
    if p in (0.0, 1.0, 2.0):
        return p * (p - 1)  # x^(p - 2) drops out
    lo = gap(operands[0]) if p < 2 else mag(operands[0])
    return abs(p * (p - 1)) * lo ** (p - 2) if lo > 0 else math.inf


def _over(lo: float, f) -> float:
    """f(lo) where the operand's range starts above 0 (log, sqrt, rsqrt; a divisor's gap), else unbounded."""
    return f(lo) if lo > 0 else math.inf


#: (kappa, Lipschitz constant) of each curvature formula an op declares (``Op.curvature``), over
#: its operand ranges; an op that declares a pair of numbers has those bounds over any range
FORMULAS = {
    "exp": (lambda attrs, o: _exp(2 * o[0][1]), lambda attrs, o: _exp(o[0][1])),
    "log": (lambda attrs, o: _over(o[0][0], lambda lo: 1 / lo ** 2),
            lambda attrs, o: _over(o[0][0], lambda lo: 1 / lo)),
    "log1p": (lambda attrs, o: _over(o[0][0] + 1, lambda lo: 1 / lo ** 2),
              lambda attrs, o: _over(o[0][0] + 1, lambda lo: 1 / lo)),
    "div": (lambda attrs, o: _over(gap(o[1]), lambda d: 2 * mag(o[0]) / d ** 3),
            lambda attrs, o: _over(gap(o[1]), lambda d: max(1 / d, mag(o[0]) / d ** 2))),
    "sqrt": (lambda attrs, o: _over(o[0][0], lambda lo: 1 / (4 * lo ** 1.5)),
             lambda attrs, o: _over(o[0][0], lambda lo: 0.5 / math.sqrt(lo))),
    "rsqrt": (lambda attrs, o: _over(o[0][0], lambda lo: 3 / (4 * lo ** 2.5)),
              lambda attrs, o: _over(o[0][0], lambda lo: 0.5 / lo ** 1.5)),
    "pow": (_pow, lambda attrs, o: 1.0),
    # bilinear: constant cross curvature, unless one side is a constant
    "bilinear": (lambda attrs, o: 0.0 if any(lo == hi for lo, hi in o[:2]) else 1.0,
                 lambda attrs, o: max(mag(o[0]), mag(o[1]))),
    "layer_norm": (lambda attrs, o: 1 / (4 * attrs[0] ** 1.5),  # 1/sqrt(var + eps), var = 0
                   lambda attrs, o: 1.0),
    "swish": (lambda attrs, o: 0.5 * abs(attrs[0]), lambda attrs, o: 1.1),  # silu's, at b x
}


def _curvature(op: str, attrs: tuple, operands: list[Interval], which: int) -> float:
    declared = OPS[op].curvature
    try:
        return declared[which] if isinstance(declared, tuple) else FORMULAS[declared][which](attrs, operands)
    except (ZeroDivisionError, OverflowError):  # tiny ranges make 1/lo^2 overflow: unbounded, not an error
        return math.inf


def kappa(op: str, attrs: tuple, operands: list[Interval]) -> float:
    """Curvature of one node over its operand ranges (inf when unbounded)."""
    return _curvature(op, attrs, operands, 0)


def lipschitz(op: str, attrs: tuple, operands: list[Interval]) -> float:
    """Largest |derivative| of one node over its operand ranges."""
    return _curvature(op, attrs, operands, 1)


def rounding(dtype: str, result: Interval) -> float:
    return UNIT_ROUNDOFF.get(dtype, 0.0) * mag(result)


#: casts that hold every value of their source dtype
WIDENING = {("float16", "float32"), ("bfloat16", "float32"), ("float16", "float64"),
            ("bfloat16", "float64"), ("float32", "float64")}


def rounding_free(op: str, attrs: tuple, operand_dtypes: tuple) -> bool:
    """Exact operands give an exact result: an op that never rounds, or a cast that widens or keeps the dtype."""
    if (kind := OPS[op].rounding) == "widening":
        source = operand_dtypes[0] if operand_dtypes else None
        return source == attrs[0] or (source, attrs[0]) in WIDENING
    return kind == "exact"


def cancels(op: str, operands: list[Interval], exact: tuple[bool, ...]) -> bool:
    """A subtraction (or addition of opposite signs) of possibly close operands, one carrying rounding error: unbounded
    relative error. So is a sum of exact values of both signs (1e8 + 1 - 1e8 = 0), unless compensated."""
    if (error := OPS[op].error) == "sum":
        return exact[0] and operands[0][0] < 0 < operands[0][1]
    if error != "cancels" or all(exact[:2]):
        return False
    a, b = operands[:2]
    b = (-b[1], -b[0]) if op == "add" else b  # a + b = a - (-b)
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return lo <= hi and (lo, hi) != (0, 0)  # meeting only at 0, they have opposite signs
    # (exp(x) + exp(y), both in [0, inf)): their magnitudes add, nothing cancels


def overflows(result: Interval, dtype: str) -> bool:
    """The result's range reaches the largest finite value of its dtype: past it, or clipped at it
    (an analysis that meets a range with the dtype's bounds proves no finite result)."""
    limit = FINITE_MAX.get(dtype)
    return limit is not None and mag(result) >= limit


#: bounded kappa enters the cost in decibels up to this much: it breaks ties between forms of equal error terms and
#: never outweighs one (bench/curvature_vs_error: no float32 error where only it grows, exp over [-50, 50])
KAPPA_TIE_BREAK = 3
#: |x| past which exp(x) is 0 or inf in the dtype (log of the smallest subnormal): there no digit
#: of exp(x) depends on the error x carries, so exp's condition number |x| stops there
EXP_LIMIT = {d: round(-math.log(f.tiny * f.eps), 1) for d, f in _FINFO.items()}
#: cost of losing every digit: a cancellation, or an amplification of rounding error past 1 / unit roundoff
ALL_DIGITS = 2000
def _amplified(factor: float, dtype: str) -> int:
    """Decibels of amplifying an operand's rounding error; past 1 / unit roundoff, a cancellation's cost."""
    return ALL_DIGITS if factor * UNIT_ROUNDOFF.get(dtype, UNIT_ROUNDOFF["float32"]) >= 1 \
        else round(10 * math.log10(1 + factor))


def _cancellation(op: str, operands: list[Interval], result: Interval | None, dtype: str) -> int:
    """a +- b amplifies its operands' rounding errors by (|a| + |b|) / |a +- b|: past 1 / unit roundoff where the result
    can be 0, else bounded by its distance from 0, which its e-class's interval proves from every equivalent form."""
    apart = gap(result) if op in ("add", "sub") and result is not None else 0.0
    return ALL_DIGITS if apart == 0 else _amplified((mag(operands[0]) + mag(operands[1])) / apart, dtype)


def kappa_cost(op: str, attrs: tuple, operands: list[Interval], result: Interval | None = None,
               dtype: str = "float32", exact: tuple[bool, ...] = ()) -> int:
    """Integer extraction cost of conditioning: a tie-breaking few decibels of kappa where the ranges bound it, the
    growth class (x1000) where they do not, plus decibels of amplified error, cancellations and consumed overflows."""
    k = kappa(op, attrs, operands)
    k = math.inf if math.isnan(k) else k  # inf * 0 over an unbounded range: no bound known
    cost = 0 if k == 0 else (1000 * OPS[op].growth if math.isinf(k)
                             else min(KAPPA_TIE_BREAK, max(1, round(10 * math.log10(1 + k)))))
    if exact and cancels(op, operands, exact):
        cost += _cancellation(op, operands, result, dtype)
    if (error := OPS[op].error) == "rotation" or op == "linear_add" and result is not None:  # its spelled form's add
        m = mag(operands[0])  # of rounded products, or of the rounded x W^T + b (the result less r) and r
        terms = [(-m * mag(o), m * mag(o)) for o in operands[1:3]] if error == "rotation" else \
            [(result[0] - operands[3][1], result[1] - operands[3][0]), operands[3]]
        if cancels("add", terms, (False, False)):
            cost += _cancellation("add", terms, result, dtype)
    limit = EXP_LIMIT.get(dtype, EXP_LIMIT["float32"])
    if error == "exp" and exact and not exact[0]:
        cost += _amplified(min(mag(operands[0]), limit), dtype)  # exp's condition number is
        # |x|: the rounding error its computed argument carries comes out multiplied by it
    if error in ("shifted-exp", "log-sum-exp"):  # softmax and kin: exp(x - max(x)) inside
        cost += _amplified(min(operands[0][1] - operands[0][0], limit), dtype)  # exp(x - max(x)):
        # its argument is rounded, and exp multiplies that error by |x - max(x)| <= hi - lo
    if error == "log" and exact and not exact[0] and operands[0][0] > 0:
        lo, hi = operands[0]  # log's condition number is 1 / |log u|: near u = 1 the rounding
        # error of a computed argument (1 + x rounded) becomes the whole result (why log1p exists)
        cost += _amplified(math.inf if lo <= 1 <= hi else max(1 / abs(math.log(u)) for u in (lo, hi)), dtype)
    if error == "log" and exact and not exact[0] and operands[0][0] <= 0 < operands[0][1]:
        cost += 3000  # a computed value that may have underflowed to 0 (a softmax, a sigmoid, a
        # sum of exps): log makes -inf of it, where log_softmax, logsumexp or softplus stay finite
    if error == "log-sum-exp" and result is not None and result[0] <= 0 <= result[1]:
        cost += ALL_DIGITS  # the log inside (of sum(exp(x - max(x))) >= 1) near 1, as a bare log's:
        # log_softmax(x) at the dominant x is -log(1 + tiny) = 0 in float32, not -tiny
    rounded = [o for i, o in enumerate(operands) if not (i < len(exact) and exact[i])]
    if result is not None and any(overflows(o, dtype) for o in rounded) and not overflows(result, dtype) and \
            error != "shifted-exp":  # a softmax's scores: its fused attention's hide them, with the same values
        cost += 3000  # an infinity from rounding is consumed into a finite value (inf / inf, log of inf): NaN or a
        # wrong number. An exact one (a -inf attention mask) is meant. An overflow that reaches the output unchanged
        # costs nothing here: every equivalent program overflows there too (the result's range is its e-class's)
    return cost
