"""Value-range analysis: a sound interval for every term.

Inputs range over their declared interval, otherwise over every finite value of their dtype.
Bounds are clamped to +-BIG so that no analysis ever sees inf or NaN (inf - inf would poison every
class downstream). Reductions and matmuls use the sizes from shape inference.

>>> x = Term.input("x", (4,))
>>> iv = intervals([Term("exp", (x,))], {"x": (0.0, 1.0)})
>>> [round(v, 3) for v in iv[-1]]
[1.0, 2.718]
"""
from __future__ import annotations

import math
from typing import Callable

import torch

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
    t = getattr(torch, dtype)
    if t == torch.bool:
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


def _monotone(f: Callable[[float], float]):
    return lambda a: iv(_safe(f, a[0], -BIG), _safe(f, a[1], BIG))


def _mul(a: Interval, b: Interval) -> Interval:
    products = [clamp(x * y) for x in a for y in b]
    return min(products), max(products)


def _div(a: Interval, b: Interval) -> Interval:
    if b[0] > 0 or b[1] < 0:
        return _mul(a, (clamp(1 / b[1]), clamp(1 / b[0])))
    return TOP


def _pow(a: Interval, b: Interval) -> Interval:
    if b[0] != b[1]:
        return TOP if a[0] <= 0 else iv(0.0, BIG)
    p = b[0]
    if p == 0:
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


def _hull(*ivs: Interval) -> Interval:
    return min(i[0] for i in ivs), max(i[1] for i in ivs)


def _sigmoid(v: float) -> float:
    return 1 / (1 + math.exp(-v)) if v > -700 else 0.0


def _log(a: Interval, shift: float = 0.0) -> Interval:
    lo = a[0] + shift
    return (_safe(math.log, lo, -BIG) if lo > 0 else -BIG), (
        _safe(math.log, a[1] + shift, BIG) if a[1] + shift > 0 else -BIG)


GELU_MIN = -0.1701  # min over x of x * Phi(x) (erf and tanh forms), at x ~ -0.75


def transfer(t: Term, a: list[Interval], n: int, k: int) -> Interval:
    """The interval of ``t`` from its operands' intervals; ``n`` = reduced axis size, ``k`` =
    matmul inner size."""
    op = t.op
    if op == "const":  # a NaN constant (x + math.nan) is legal: no value to bound, so unbounded
        return TOP if math.isnan(t.attrs[0]) else iv(t.attrs[0], t.attrs[0])
    if op in ("add", "sub"):
        y = a[1] if op == "add" else (-a[1][1], -a[1][0])
        return iv(a[0][0] + y[0], a[0][1] + y[1])
    if op == "mul":
        return _mul(a[0], a[1]) if t.args[0] is not t.args[1] else _pow(a[0], (2.0, 2.0))
    if op == "div":
        return _div(a[0], a[1])
    if op == "pow":
        return _pow(a[0], a[1])
    if op == "neg":
        return -a[0][1], -a[0][0]
    if op in ("maximum", "minimum"):
        f = max if op == "maximum" else min
        return f(a[0][0], a[1][0]), f(a[0][1], a[1][1])
    if op == "where":
        return _hull(a[1], a[2])
    if op == "abs":
        lo, hi = a[0]
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
    if op in MONOTONE:
        return MONOTONE[op](a[0])
    if op == "log":
        return _log(a[0])
    if op == "log1p":
        return _log(a[0], 1.0)
    if op == "sqrt":
        return iv(math.sqrt(max(a[0][0], 0.0)), math.sqrt(max(a[0][1], 0.0)))
    if op == "rsqrt":
        return (iv(1 / math.sqrt(a[0][1]), 1 / math.sqrt(a[0][0])) if a[0][0] > 0 else (0.0, BIG))
    if op in ("sin", "cos"):
        return -1.0, 1.0
    if op == "gelu":  # x * Phi(x): increasing for x >= 0, within [GELU_MIN, 0] for x <= 0
        g = lambda v: float(torch.nn.functional.gelu(  # noqa: E731
            torch.tensor(v, dtype=torch.float64), approximate=t.attrs[0]))
        return (g(a[0][0]) if a[0][0] >= 0 else GELU_MIN), (g(a[0][1]) if a[0][1] >= 0 else 0.0)
    if op in ("sum", "compensated_sum"):
        return iv(n * a[0][0], n * a[0][1])
    if op in ("mean", "max", "transpose", "permute", "reshape", "expand", "slice", "gather",
              "index_select", "cast", "max_pool2d"):
        return a[0]
    if op == "var":
        return 0.0, clamp((a[0][1] - a[0][0]) * (a[0][1] - a[0][0]))
    if op == "concat":
        return _hull(a[0], a[1])
    if op == "matmul":
        p = _mul(a[0], a[1])
        return iv(k * p[0], k * p[1])
    if op in ("linear", "linear_act", "conv2d"):
        p = _mul(a[0], a[1])
        out = iv(k * p[0] + a[2][0], k * p[1] + a[2][1])
        if op == "linear_act":
            return (max(out[0], 0.0), max(out[1], 0.0)) if t.attrs[0] == "relu" else (
                GELU_MIN, max(out[1], 0.0))
        return out
    if op == "sdpa_masked":
        return a[2]
    if op == "batch_norm":
        return TOP
    if op == "softmax":
        return 0.0, 1.0
    if op == "log_softmax":
        return iv(a[0][0] - a[0][1] - math.log(max(n, 1)), 0.0)
    if op == "logsumexp":
        return iv(a[0][0] + math.log(max(n, 1)), a[0][1] + math.log(max(n, 1)))
    if op == "sdpa":
        return a[2]
    if op == "softplus":
        return iv(_safe(lambda v: v + math.log1p(math.exp(-v)) if v > 0 else math.log1p(math.exp(v)),
                        a[0][0], 0.0), max(a[0][1], 0.0) + math.log(2))
    if op == "logaddexp":
        return iv(max(a[0][0], a[1][0]), max(a[0][1], a[1][1]) + math.log(2))
    if op == "layer_norm":
        r = math.sqrt(max(n - 1, 1))
        return iv(*(x + y for x, y in zip(_mul((-r, r), a[1]), a[2])))
    raise KeyError(f"no range transfer for op {op!r}")


MONOTONE = {
    "exp": _monotone(math.exp), "expm1": _monotone(math.expm1), "tanh": _monotone(math.tanh),
    "sigmoid": _monotone(_sigmoid), "erf": _monotone(math.erf),
    "relu": lambda a: (max(a[0], 0.0), max(a[1], 0.0)),
}


def intervals(roots: list[Term], declared: dict[str, Interval] | None = None,
              leaf_meta: dict[str, tuple] | None = None) -> list[Interval]:
    """Sound intervals of ``roots``; see :func:`analyze` for every term's."""
    table = analyze(roots, declared, leaf_meta)
    return [table[id(r)] for r in roots]


def analyze(roots: list[Term], declared: dict[str, Interval] | None = None,
            leaf_meta: dict[str, tuple] | None = None, meta: dict | None = None
            ) -> dict[int, Interval]:
    """Interval of every term reachable from ``roots``, keyed by term id. ``declared`` maps input
    names to ranges; undeclared leaves range over their dtype's finite values. ``meta``: the
    terms' shapes, when already known."""
    declared = declared or {}
    meta = meta if meta is not None else shapes(roots, leaf_meta)
    out: dict[int, Interval] = {}
    for t in postorder(roots):
        if t.op in ("input", "param", "opaque"):
            rng = dtype_range(str(meta[id(t)][1]).removeprefix("torch."))
            if t.op == "input" and t.attrs[0] in declared:
                lo, hi = declared[t.attrs[0]]
                rng = (max(lo, rng[0]), min(hi, rng[1]))
            out[id(t)] = iv(*rng)
            continue
        shape_in = meta[id(t.args[0])][0] if t.args else ()
        n = shape_in[t.attrs[0]] if t.op in REDUCING and shape_in else 1
        k = shape_in[-1] if t.op in ("matmul", "linear", "linear_act") and shape_in else 1
        if t.op == "conv2d":
            w = meta[id(t.args[1])][0]
            k = w[1] * w[2] * w[3]
        if t.op == "layer_norm":
            n = shape_in[-1]
        out[id(t)] = transfer(t, [out[id(a)] for a in t.args], n, k)
    return out


REDUCING = {"sum", "compensated_sum", "mean", "max", "var", "log_softmax", "logsumexp", "softmax"}
