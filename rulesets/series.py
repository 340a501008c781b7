"""Truncated Taylor series in Horner form of a program's own function, as Herbie takes them: around 0 and around
infinity (in u = 1/x), each ``x^shift`` times a power series in u or u^2, its coefficients sympy's, exact; its degree
the least whose relative truncation error, measured at 60 digits on a dense grid of |u| <= its radius (the largest
octave it can be), is at most ``TARGET``. A series is close to its function only near its point, so it never joins an
e-class: regime inference (``extractors/regimes.py``) takes it where |u| is small, counting its truncation bound."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import math
import operator
import sys
import threading
from dataclasses import dataclass, replace
from traceback import walk_stack

import mpmath
import torch

from egraph_opt.lang.ops import ELEMENTWISE, OPS
from egraph_opt.lang import pattern as pat
from egraph_opt.lang.term import Term, postorder

from . import Exactness, Family, Rule

TARGET = 2.0 ** -26  # relative truncation error at the radius: a quarter ulp of float32
ORDER = 24  # powers of u sympy expands to, the degree's cap (zeros past them: never a least degree)
SECONDS = 2.0  # sympy's time for one expansion; past it, no series
OCTAVES = range(-40, 4)  # |u| in (2^(j-1), 2^j]: where the truncation is measured, 16 points each
SAFETY = 2.0  # margin on the worst measured error, for the points between the grid's
INVERSE = "(div (const 1.0) ?x)"  # u around infinity
_INFIX = {**pat.ARITHMETIC, "**": operator.pow}
_SPELLED = {"neg": lambda s, a: -a, "log1p": lambda s, a: s.log(1 + a), "expm1": lambda s, a: s.exp(a) - 1,
            "abs": lambda s, a: s.Abs(a), "sigmoid": lambda s, a: 1 / (1 + s.exp(-a)), "sqrt": lambda s, a: s.sqrt(a),
            "cbrt": lambda s, a: s.cbrt(a)}  # as sympy spells them (a namesake: only a sympy function class)


@dataclass(frozen=True)
class Series:
    """``lhs`` (over ?x) ~ x^shift * sum_k terms[k] v^k, v = u or u^2, where |u| <= ``radius``; its
    bound at |u| <= r: the worst error measured up to the octave above r, times ``SAFETY``."""
    lhs: str
    at_infinity: bool
    square: bool
    shift: int
    terms: tuple  # the coefficients, exact (sympy numbers), of degree 0 up to the degree
    radius: float
    envelope: tuple  # per octave of |u|, the worst error at or below it, times SAFETY

    def truncation(self, r: torch.Tensor) -> torch.Tensor:
        """Relative error of the truncated series where |u| <= r (inf past the radius)."""
        r = r.double().nan_to_num(math.inf)
        j = torch.ceil(torch.log2(r)).clamp(OCTAVES[0], OCTAVES[-1]).long() - OCTAVES[0]
        return torch.where(r <= self.radius, torch.tensor(self.envelope, dtype=torch.float64)[j], math.inf)

    def rule(self) -> Rule:
        """Horner form in u times ?x^shift (around infinity u^shift = ?x^-shift)."""
        base = INVERSE if self.at_infinity else "?x"
        u, horner = f"(mul {base} {base})" if self.square else base, f"(const {float(self.terms[-1])!r})"
        for c in reversed(self.terms[:-1]):
            horner = f"(add (const {float(c)!r}) (mul {u} {horner}))"
        power = -self.shift if self.at_infinity else self.shift
        for _ in range(abs(power)):
            horner = f"(div {horner} ?x)" if power < 0 else f"(mul ?x {horner})"
        point = "infinity" if self.at_infinity else "zero"
        return Rule(f"series-at-{point}", self.lhs, horner, Family.SERIES, Exactness.APPROX,
                    why=f"around {point}, in u = {base}: degree {len(self.terms) - 1} in u{'^2' * self.square}, "
                        f"relative truncation <= 2^-26 for |u| <= {self.radius}")


def to_sympy(root: Term, variable: Term):
    """(sympy expression in x, pattern text over ?x) of ``root``, x standing for ``variable``; None
    where another input remains or an op has no sympy form (infix, ``_SPELLED`` or namesake)."""
    import sympy
    ids, x, out = pat.structural_ids([root, variable]), sympy.Symbol("x", real=True), {}
    for t in postorder([root]):
        args = [out.get(id(a)) for a in t.args]
        fn = _INFIX.get(OPS[t.op].infix) or (functools.partial(_SPELLED[t.op], sympy) if t.op in _SPELLED
                                             else getattr(sympy, t.op, None))
        fn = fn if t.op in _SPELLED or OPS[t.op].infix or isinstance(fn, sympy.FunctionClass) else None  # not maximum
        if ids[id(t)] == ids[id(variable)]:
            out[id(t)] = (x, "?x")
        elif t.op == "const" and math.isfinite(t.attrs[0]):  # (sympy takes inf and NaN for 0)
            out[id(t)] = (sympy.Rational(t.attrs[0]), f"(const {t.attrs[0]!r})")
        elif t.op in ELEMENTWISE and callable(fn) and not t.attrs and all(args):
            out[id(t)] = (fn(*(a for a, _ in args)), f"({t.op} {' '.join(b for _, b in args)})")
    return out.get(id(root))


def expand(root: Term, variable: Term, at_infinity: bool, cap: float = math.inf) -> Series | None:
    """The series of ``root`` in ``variable`` around 0 or infinity (u = 1/variable) of least degree within ``TARGET``
    on the largest octave of |u| it can be, up to ``cap``; None where there is none or sympy runs past ``SECONDS``."""
    found = to_sympy(root, variable)  # by structure, for the cache (a Term's identity is its own)
    with contextlib.suppress(TimeoutError):  # a time out is not kept in the cache: another call may have the time
        if found:
            return _expand(*found, at_infinity, min(max(cap, 2.0 ** OCTAVES[0]), 2.0 ** OCTAVES[-1]))
    return None


class _Deadline:
    """TimeoutError in this thread after ``seconds`` on any thread (an alarm signal is the main thread's, one at a
    time): raised by a timer thread, again every quarter of ``seconds`` (one raised in a GC callback is lost), only
    while the entering frame is on the stack."""

    def __init__(self, seconds: float):
        self.seconds, self.done = seconds, threading.Event()

    def __enter__(self):
        me, body = threading.get_ident(), sys._getframe(1)
        def fire(wait: float = self.seconds):
            while not self.done.wait(wait) and any(f is body for f, _ in walk_stack(sys._current_frames().get(me))):
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(me), ctypes.py_object(TimeoutError))
                wait = self.seconds / 4
        self.timer = threading.Thread(target=fire, daemon=True)
        self.timer.start()

    def __exit__(self, *_):
        self.done.set()
        self.timer.join()
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)  # one in flight


@functools.lru_cache(maxsize=256)
def _expand(f, lhs: str, at_infinity: bool, cap: float) -> Series | None:
    import sympy
    (x,), u = f.free_symbols or (None,), sympy.Symbol("u", real=True)  # none (x - x): subs fails, no series
    try:
        with _Deadline(SECONDS):
            s = sympy.expand(sympy.series(f.subs(x, 1 / u if at_infinity else u), u, 0, ORDER).removeO())
            pairs = [t.as_coeff_exponent(u) for t in sympy.Add.make_args(s)]
    except TimeoutError:  # not kept in the cache: another call may have the time
        raise
    except Exception:  # noqa: BLE001 - a pole, a branch, no expansion: no series
        return None
    if s == 0 or f.has(sympy.zoo, sympy.nan) or not all(c.is_real and c.is_number and p.is_integer for c, p in pairs):
        return None
    shift = int(min(p for _, p in pairs))
    step = 2 if all((p - shift) % 2 == 0 for _, p in pairs) else 1
    terms = tuple(sum((c for c, p in pairs if p == shift + k * step), sympy.S.Zero) for k in range(ORDER))
    g = sympy.lambdify(x, f, "mpmath")
    with contextlib.suppress(ValueError, ZeroDivisionError, TypeError):  # defined at 0: the series must give it
        if not at_infinity and math.isfinite(at := float(g(0))) and at != float(terms[0] if shift == 0 else 0):
            return None  # 0 ** y is 1 at y = 0, where sympy's 0 ** y - y has the series -y
    full = Series(lhs, at_infinity, step == 2, shift, terms, cap, ())
    return _truncate(g, full, sympy.lambdify(x, f, ["math", "mpmath"]))


def _truncate(f, full: Series, rough) -> Series | None:
    """``full`` (its radius: the cap) cut as ``expand`` says, its error against ``f`` (``rough``: float64, finite)."""
    with mpmath.workdps(60):
        points = [s * mpmath.mpf(2) ** j * (17 + i) / 32 for j in OCTAVES for i in range(16) for s in (1, -1)]
        coefficients = [mpmath.mpf(str(c.evalf(70))) for c in full.terms]
        errors, values = [[math.inf] * len(points) for _ in coefficients], []  # by degree, at each point
        for i, p in enumerate(points):  # |u| ascending, each sign in turn
            y = None
            with contextlib.suppress(ValueError, ZeroDivisionError, TypeError, OverflowError):  # undefined: inf
                q = 1 / p if full.at_infinity else p
                if math.isfinite(rough(float(q))):  # past float64, mpmath may take all memory: exp(exp(2 ** 44))
                    y = f(q)
            e, w, a, scale = y if isinstance(y, mpmath.mpf) else 0, mpmath.mpf(1), 0, p ** full.shift
            values.append(e)  # inf where undefined, and past a zero or pole between points (a sign change)
            for k, c in enumerate(coefficients if e and (i < 2 or values[i - 2] * e > 0) else ()):
                a, w = a + c * w, w * (p * p if full.square else p)
                errors[k][i] = float(abs((a * scale - e) / e))
    envelopes = [list(itertools.accumulate((SAFETY * max(e[32 * i:32 * i + 32]) for i in range(len(OCTAVES))), max))
                 for e in errors]
    top = min(len(OCTAVES), int(math.ceil(math.log2(full.radius))) - OCTAVES[0] + 1)
    for j, (n, envelope) in itertools.product(range(top - 1, -1, -1), enumerate(envelopes)):
        if envelope[j] <= TARGET:  # the largest octave first, the least degree on it
            return replace(full, terms=full.terms[:n + 1], radius=2.0 ** OCTAVES[j], envelope=tuple(envelope))
    return None

