"""Value-range analysis: a sound interval for every term.

Inputs range over their declared interval, else over their dtype's finite values. Bounds are clamped to +-BIG so no
analysis sees inf or NaN (inf - inf would poison every class downstream). Reductions and matmuls use the sizes from
shape inference: over a size-0 axis a reduction is its identity (sum 0, logsumexp -inf) or NaN (mean, var: unbounded).
>>> x = Term.input("x", (4,))
>>> iv = intervals([Term("exp", (x,))], {"x": (0.0, 1.0)})
>>> [round(v, 3) for v in iv[-1]]
[1.0, 2.718]
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..lang.ops import OPS, REDUCTIONS
from ..lang.term import Term, postorder, shapes

BIG = 1e300
Interval = tuple[float, float]
TOP: Interval = (-BIG, BIG)


def clamp(v: float) -> float:
    if math.isnan(v):
        raise ValueError("NaN in range analysis")
    return min(max(v, -BIG), BIG)


def iv(lo: float, hi: float) -> Interval:
    return clamp(lo), clamp(hi)


def dtype_range(dtype: str) -> Interval:
    if (t := getattr(torch, dtype)) == torch.bool:
        return 0.0, 1.0
    if t.is_complex:  # not ordered: no interval bounds it (an opaque fft's result)
        return TOP
    info = torch.finfo(t) if t.is_floating_point else torch.iinfo(t)
    return float(info.min), float(info.max)


def _safe(f: Callable[[float], float], v: float, overflow: float) -> float:
    try:
        return clamp(f(v))
    except (OverflowError, ValueError, ZeroDivisionError):
        return overflow


def _mul(a: Interval, b: Interval) -> Interval:
    products = [clamp(x * y) for x in a for y in b]
    return min(products), max(products)


def _div(a: Interval, b: Interval) -> Interval:
    return _mul(a, (clamp(1 / b[1]), clamp(1 / b[0]))) if b[0] > 0 or b[1] < 0 else TOP


def _pow(a: Interval, b: Interval) -> Interval:
    if b[0] != b[1]:
        return TOP if a[0] <= 0 else iv(0.0, BIG)
    if (p := b[0]) == 0:
        return 1.0, 1.0
    if p == int(p):
        ends = [_safe(lambda v: v ** p, v, BIG) for v in a]
        if p % 2 == 0:
            return (0.0 if a[0] <= 0 <= a[1] else min(ends)), max(ends)
        return (min(ends), max(ends)) if p > 0 else _div((1.0, 1.0), _pow(a, (-p, -p)))
    if a[0] < 0:
        return TOP
    ends = [_safe(lambda v: v ** p, v, BIG) if v > 0 else (0.0 if p > 0 else BIG) for v in a]
    return min(ends), max(ends)


def hull(*ivs: Interval) -> Interval:
    """The least interval holding every one of ``ivs``."""
    return min(i[0] for i in ivs), max(i[1] for i in ivs)


def _log(a: Interval, shift: float = 0.0) -> Interval:
    """log(a + shift). Of an argument that is negative throughout, NaN: no interval bounds it
    (claiming -BIG once clashed with the bounds another form of the same e-class proved)."""
    lo, hi = a[0] + shift, a[1] + shift
    if hi < 0:
        return TOP
    hi = math.inf if hi >= BIG else hi  # an end at BIG is no bound, +inf among them: log(BIG) is 690
    return (_safe(math.log, lo, -BIG) if lo > 0 else -BIG), (_safe(math.log, hi, BIG) if hi > 0 else -BIG)


def gap(a: Interval) -> float:
    """Distance of an interval from 0 (0 when it holds 0)."""
    return 0.0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1]))


def mag(a: Interval) -> float:
    """Largest magnitude in an interval."""
    return max(abs(a[0]), abs(a[1]))


GELU_MIN = -0.1701  # min over x of x * Phi(x) (erf and tanh forms), at x ~ -0.75


def _axis_size(t: Term, s: list) -> int:
    """Size of the axis an op reduces or normalizes over (its ``axis`` attribute)."""
    return s[0][t.attrs[0]] if s[0] else 1


def _gelu(t, a, s):  # x * Phi(x): increasing for x >= 0, within [GELU_MIN, 0] for x <= 0
    g = lambda v: float(torch.nn.functional.gelu(  # noqa: E731
        torch.tensor(v, dtype=torch.float64), approximate=t.attrs[0]))
    return (g(a[0][0]) if a[0][0] >= 0 else GELU_MIN), (g(a[0][1]) if a[0][1] >= 0 else 0.0)


SILU_MIN = -0.2785  # min over x of x * sigmoid(x) (-0.27846 at x ~ -1.2785), rounded down
SILU_ARGMIN = -1.2785


def _silu(t, a, s):
    """x * sigmoid(x): decreasing below SILU_ARGMIN, increasing above."""
    f = lambda v: v * OPS["sigmoid"].range_rule(v)  # noqa: E731
    ends = (f(a[0][0]), f(a[0][1]))
    return iv(SILU_MIN if a[0][0] < SILU_ARGMIN < a[0][1] else min(ends), max(ends))


def _swish(t, a, s):
    """x * sigmoid(b x) = silu(b x) / b (x / 2 at b = 0)."""
    b = t.attrs[0]
    return iv(a[0][0] / 2, a[0][1] / 2) if b == 0 else _div(_silu(t, [_mul(a[0], (b, b))], s), (b, b))


def _rotary(t, a, s):
    """x cos + (+-x) sin: both products bounded by |x|'s magnitude."""
    m = mag(a[0])
    c, d = _mul((-m, m), a[1]), _mul((-m, m), a[2])
    return iv(c[0] + d[0], c[1] + d[1])


def _linear(t, a, s):
    """x w^T + b (+ linear_add's residual), or a convolution: k terms (a row, a filter) per output."""
    k = math.prod(s[1][1:]) if len(s[1]) > 1 else (s[0][-1] if s[0] else 1)
    p, (r_lo, r_hi) = _mul(a[0], a[1]), a[3] if len(a) > 3 else (0.0, 0.0)
    return iv(k * p[0] + a[2][0] + r_lo, k * p[1] + a[2][1] + r_hi)


def _matmul(t, a, s):
    k, p = s[0][-1] if s[0] else 1, _mul(a[0], a[1])
    return iv(k * p[0], k * p[1])


def _layer_norm(t, a, s):
    """A normalized value lies within +-sqrt(n - 1); then the affine weight and bias."""
    r = math.sqrt(max(s[0][-1] - 1, 1))
    return iv(*(x + y for x, y in zip(_mul((-r, r), a[1]), a[2])))


def _rms_norm(t, a, s):
    """|x_i| / sqrt(mean(x^2) + eps) <= sqrt(n) for eps >= 0 (rounding: 1e-6), then weight; eps < 0 divides by ~0."""
    if t.attrs[0] < 0:
        return TOP
    r = math.sqrt(max(s[0][-1], 1)) * (1 + 1e-6) if s[0] else 1 + 1e-6
    return iv(*_mul((-r, r), a[1]))


def _linear_act(t, a, s):
    out = _linear(t, a, s)
    return (max(out[0], 0.0), max(out[1], 0.0)) if t.attrs[0] == "relu" else (GELU_MIN, max(out[1], 0.0))


def _log_n(t, s) -> float:
    return math.log(max(_axis_size(t, s), 1))


#: range transfer of each kind an op declares (``Op.range_rule``): (term, operand intervals, shapes) -> interval
TRANSFER: dict[str, Callable] = {
    "add": lambda t, a, s: iv(a[0][0] + a[1][0], a[0][1] + a[1][1]),
    "sub": lambda t, a, s: iv(a[0][0] - a[1][1], a[0][1] - a[1][0]),
    "mul": lambda t, a, s: _mul(a[0], a[1]) if t.args[0] is not t.args[1] else _pow(a[0], (2.0, 2.0)),
    "div": lambda t, a, s: _div(a[0], a[1]),
    "pow": lambda t, a, s: _pow(a[0], a[1]),
    "neg": lambda t, a, s: (-a[0][1], -a[0][0]),
    "maximum": lambda t, a, s: (max(a[0][0], a[1][0]), max(a[0][1], a[1][1])),
    "minimum": lambda t, a, s: (min(a[0][0], a[1][0]), min(a[0][1], a[1][1])),
    "select": lambda t, a, s: hull(a[1], a[2]),
    "hull": lambda t, a, s: hull(a[0], a[1]),
    "abs": lambda t, a, s: (gap(a[0]), mag(a[0])),
    "copysign": lambda t, a, s: (gap(a[0]), mag(a[0])) if a[1][0] > 0 else (-mag(a[0]), -gap(a[0])) if a[1][1] < 0
    else (-mag(a[0]), mag(a[0])),  # b in [0, hi] may be -0.0: its sign bit is no interval's
    "log": lambda t, a, s: _log(a[0]),
    "log1p": lambda t, a, s: _log(a[0], 1.0),
    "sqrt": lambda t, a, s: TOP if a[0][1] < 0 else iv(math.sqrt(max(a[0][0], 0.0)), math.sqrt(a[0][1])),
    "rsqrt": lambda t, a, s: (iv(1 / math.sqrt(a[0][1]), 1 / math.sqrt(a[0][0])) if a[0][0] > 0
                              else (0.0, BIG)),
    "bounds": lambda t, a, s: OPS[t.op].bounds,
    "gelu": _gelu,
    "silu": _silu,
    "swish": _swish,
    "geglu": lambda t, a, s: _mul(_gelu(t, a, s), a[1]),
    "rotary": _rotary,
    "sum": lambda t, a, s: iv(_axis_size(t, s) * a[0][0], _axis_size(t, s) * a[0][1]),
    "operand": lambda t, a, s: TOP if t.op in REDUCTIONS and not _axis_size(t, s) else a[0],
    # among (or between) the operand's values; over a size-0 axis a max raises, a mean is NaN
    "values": lambda t, a, s: a[0],  # exactly the operand's values
    "values-of-v": lambda t, a, s: a[2],  # attention: averages of the values
    "var": lambda t, a, s: TOP if _axis_size(t, s) <= t.attrs[2] else  # 0 / 0 past the correction
    (0.0, clamp((a[0][1] - a[0][0]) * (a[0][1] - a[0][0]))),
    "matmul": _matmul,
    "linear": _linear,
    "linear_act": _linear_act,
    "top": lambda t, a, s: TOP,
    "log_softmax": lambda t, a, s: iv(a[0][0] - a[0][1] - _log_n(t, s), 0.0),
    "logsumexp": lambda t, a, s: (-BIG, -BIG) if not _axis_size(t, s) else  # log(0)
    iv(a[0][0] + _log_n(t, s), a[0][1] + _log_n(t, s)),
    "softplus": lambda t, a, s: iv(_safe(lambda v: v + math.log1p(math.exp(-v)) if v > 0
                                         else math.log1p(math.exp(v)), a[0][0], 0.0),
                                   max(a[0][1], 0.0) + math.log(2)),
    "logaddexp": lambda t, a, s: iv(max(a[0][0], a[1][0]), max(a[0][1], a[1][1]) + math.log(2)),
    "layer_norm": _layer_norm,
    "tan": lambda t, a, s: iv(math.tan(a[0][0]), math.tan(a[0][1]))  # increasing between its poles
    if -math.pi / 2 < a[0][0] and a[0][1] < math.pi / 2 else TOP,
    "hypot": lambda t, a, s: iv(math.hypot(gap(a[0]), gap(a[1])), math.hypot(mag(a[0]), mag(a[1]))),
    "rms_norm": _rms_norm}


def transfer(t: Term, a: list[Interval], s: list[tuple[int, ...]]) -> Interval:
    """``t``'s interval from operand intervals ``a`` and shapes ``s``, by its op's range kind."""
    if t.op == "const":  # a NaN constant (x + math.nan) is legal: no value to bound, so unbounded
        return TOP if math.isnan(t.attrs[0]) else iv(t.attrs[0], t.attrs[0])
    if callable(kind := OPS[t.op].range_rule):
        return iv(_safe(kind, a[0][0], -BIG), _safe(kind, a[0][1], BIG))
    if kind not in TRANSFER:
        raise KeyError(f"no range transfer for op {t.op!r} (kind {kind!r})")
    return TRANSFER[kind](t, a, s)


def intervals(roots: list[Term], declared: dict[str, Interval] | None = None,
              leaf_meta: dict[str, tuple] | None = None) -> list[Interval]:
    """Sound intervals of ``roots``; see :func:`analyze` for every term's."""
    table = analyze(roots, declared, leaf_meta)
    return [table[id(r)] for r in roots]


def analyze(roots: list[Term], declared: dict[str, Interval] | None = None, leaf_meta: dict[str, tuple] | None = None,
            meta: dict | None = None) -> dict[int, Interval]:
    """Interval of every term reachable from ``roots``, by term id. ``declared``: inputs' ranges (else
    their dtype's finite values); ``meta``: the terms' shapes, when already known."""
    declared, meta = declared or {}, meta if meta is not None else shapes(roots, leaf_meta)
    out: dict[int, Interval] = {}
    for t in postorder(roots):
        if t.op in ("input", "param", "opaque"):
            rng = dtype_range(str(meta[id(t)][1]).removeprefix("torch."))
            if t.op == "input" and t.attrs[0] in declared:
                lo, hi = declared[t.attrs[0]]
                rng = (max(lo, rng[0]), min(hi, rng[1]))
            out[id(t)] = iv(*rng)
            continue
        out[id(t)] = transfer(t, [out[id(a)] for a in t.args], [meta[id(a)][0] for a in t.args])
    return out

