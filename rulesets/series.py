"""Truncated Taylor series in Horner form, near a removable singularity or a cancellation at 0.

A series is close to its left side only near 0, so it never joins an e-class in saturation (a
union would let every objective take it over the whole range): the regime inference of the
stability objective (``extractors/regimes.py``) matches it against the root e-class and may take
it on a regime where |x| is small, counting its truncation bound over that regime's interval.

Each row: the left side, the Horner variable (``?x`` or ``?x * ?x``), the power of ``?x`` factored
out, the exact coefficients, and the radius it holds on (its guard). The degree is the least
whose relative truncation error at the radius is at most ``TARGET``.

>>> ROWS[0].degree, float(ROWS[0].truncation(torch.tensor(1.0))) <= TARGET
(4, True)
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import torch

from . import Exactness, Family, Rule

TARGET = 2.0 ** -26  # relative truncation error at the radius: a quarter ulp of float32
TERMS = 60  # terms of the series summed past the degree for the bound; the rest (|c_k| <= 2/k!)
# is below 2 r^k e^r / k!, added as such


@dataclass(frozen=True)
class Series:
    name: str
    lhs: str
    square: bool  # the Horner variable is ?x * ?x (an even or odd function), else ?x
    shift: int  # the series is ?x^shift * sum_k c_k u^k
    coefficient: Callable[[int], Fraction]  # c_k, exact; |c_k| <= 2 / k! for every row
    radius: float  # |?x| <= radius: where it is used at most
    why: str = ""

    @functools.cached_property
    def degree(self) -> int:
        return next(n for n in range(1, 40) if float(self._bound(torch.tensor(self.radius), n)) <= TARGET)

    def _bound(self, r: torch.Tensor, n: int) -> torch.Tensor:
        """Relative truncation bound after degree ``n`` at |?x| <= r: the tail's sum of |c_k| u^k
        over a lower bound of |sum_k c_k u^k| (|c_0| less every other term's magnitude)."""
        r = r.double()
        u, last = (r * r if self.square else r), n + TERMS + 1
        terms = [abs(float(self.coefficient(k))) * u ** k for k in range(1, last)]
        rest = 2 / math.factorial(last) * u ** last * torch.exp(u)
        tail = sum(terms[n:]) + rest
        floor = abs(float(self.coefficient(0))) - sum(terms) - rest
        return torch.where((floor > 0) & (r <= self.radius), tail / floor, math.inf)

    def truncation(self, r: torch.Tensor) -> torch.Tensor:
        """Relative error of the truncated series where |?x| <= r (inf past the radius)."""
        return self._bound(r, self.degree)

    def rule(self) -> Rule:
        u = "(mul ?x ?x)" if self.square else "?x"
        coefficients = [self.coefficient(k) for k in range(self.degree + 1)]
        horner = f"(const {float(coefficients[-1])!r})"
        for c in reversed(coefficients[:-1]):
            horner = f"(add (const {float(c)!r}) (mul {u} {horner}))"
        for _ in range(self.shift):
            horner = f"(mul ?x {horner})"
        r = self.radius
        return Rule(self.name, self.lhs, horner, Family.SERIES, Exactness.APPROX,
                    when=(f"(<= (hi ?x) {r!r})", f"(>= (lo ?x) {-r!r})"),
                    why=f"{self.why}; degree {self.degree} in {'x^2' if self.square else 'x'}, "
                        f"relative truncation <= 2^-26 for |x| <= {r}")


def _factorial(k: int) -> Fraction:
    return Fraction(math.factorial(k))


ROWS = [
    Series("series-one-minus-cos-over-square", "(div (sub (const 1.0) (cos ?x)) (mul ?x ?x))",
           square=True, shift=0, coefficient=lambda k: (-1) ** k / _factorial(2 * k + 2), radius=1.0,
           why="(1 - cos x) / x^2 = sum (-1)^k x^2k / (2k+2)!: 0/0 where x^2 underflows, cancels near 0"),
    Series("series-expm1-minus-x-over-square", "(div (sub (expm1 ?x) ?x) (mul ?x ?x))",
           square=False, shift=0, coefficient=lambda k: 1 / _factorial(k + 2), radius=0.5,
           why="(e^x - 1 - x) / x^2 = sum x^k / (k+2)!: cancels near 0"),
    Series("series-x-minus-sin-over-cube", "(div (sub ?x (sin ?x)) (mul (mul ?x ?x) ?x))",
           square=True, shift=0, coefficient=lambda k: (-1) ** k / _factorial(2 * k + 3), radius=1.0,
           why="(x - sin x) / x^3 = sum (-1)^k x^2k / (2k+3)!: cancels near 0"),
    Series("series-sinh-difference", "(sub (exp ?x) (exp (neg ?x)))",
           square=True, shift=1, coefficient=lambda k: 2 / _factorial(2 * k + 1), radius=1.0,
           why="e^x - e^-x = 2 sum x^(2k+1) / (2k+1)!: cancels near 0"),
]
RULES = [row.rule() for row in ROWS]
BY_NAME = {row.name: row for row in ROWS}
