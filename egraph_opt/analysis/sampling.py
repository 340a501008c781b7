"""Points of the declared input ranges where rounding errors live, for estimating error over a range.

Uniform sampling by value almost never draws the values near zero where expm1 and log1p matter, nor two inputs close
enough for a difference of their functions to cancel. So, as Herbie samples, values are drawn uniformly over the
*floating-point numbers* of a range (every binade alike), and rows of other kinds are mixed in: uniform by value,
coincident with the same row of the first input of the same shape (y within a few ulps to a few digits of x), and
near-constant (where a reduction's spread cancels), half of them at an end of the range. Both ends are always drawn.

Ranges are the declared ones (those soundness uses), never values seen in example inputs. An undeclared input is drawn
as Herbie draws every input: uniformly over the bit patterns of its dtype's finite numbers, and nothing else, so a
form accurate on more of the dtype's numbers is estimated better.
>>> gen = torch.Generator().manual_seed(0)
>>> x = float32_between(1e-6, 1e3, (10000,), gen)
>>> bool(((x >= 1e-6) & (x <= 1e3)).all()), bool((x < 1e-3).float().mean() > 0.3)
(True, True)
"""
from __future__ import annotations

import math

import torch

from .ranges import Interval, dtype_range

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
#: row kinds, in the order rows take them: float-uniform, value-uniform, coincident, near-constant
ROW_KINDS = ("float", "value", "coincident", "constant")


def ordinal(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each float64 value rounded to ``dtype``, as its position among that dtype's numbers: the
    difference of two positions counts the numbers between them (Herbie's ulps)."""
    bits = torch.finfo(dtype).bits
    i = value.to(dtype).view({16: torch.int16, 32: torch.int32}[bits]).long()
    return torch.where(i < 0, -(i & (2 ** (bits - 1) - 1)), i)


def from_ordinal(k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The numbers of ``dtype`` at positions ``k`` (the inverse of ``ordinal``)."""
    bits = torch.finfo(dtype).bits
    return torch.where(k < 0, (-k) | -2 ** (bits - 1), k).to({16: torch.int16, 32: torch.int32}[bits]).view(dtype)


def float32_between(lo: float, hi: float, shape, gen: torch.Generator,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values uniform over the numbers of ``dtype`` (float32 unless told) in [lo, hi], by ordinal."""
    first, last = ordinal(torch.tensor([lo, hi], dtype=torch.float64), dtype)
    k = first + (torch.rand(shape, generator=gen, dtype=torch.float64) * (last - first)).round().long()
    return from_ordinal(k, dtype)


def bit_patterns(dtype: str, shape, gen: torch.Generator) -> torch.Tensor:
    """An undeclared input of ``dtype``: uniform over the bit patterns of its finite numbers
    (Herbie's sampling: as many points in [1, 2) as in [2^-100, 2^-99]).
    >>> v = bit_patterns("float16", (4000,), torch.Generator().manual_seed(0))
    >>> bool(v.isfinite().all()), bool(((v.abs() > 1) & (v.abs() < 2)).float().mean() < 0.1)
    (True, True)
    """
    kind = getattr(torch, dtype)
    top = float(torch.finfo(kind).max)
    return float32_between(-top, top, shape, gen, kind)


def _near(v: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """v moved by a relative 2^-4 .. 2^-23: a few digits to a few ulps."""
    scale = 2.0 ** -torch.randint(4, 24, v.shape, generator=gen).double()
    return (v.double() * (1 + torch.randn(v.shape, generator=gen, dtype=torch.float64) * scale)).float()


def _rows(lo: float, hi: float, rows: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """``rows`` x ``width`` values, row r of kind ROW_KINDS[r % 4] (coincident rows are drawn
    float-uniform here; ``sample_inputs`` moves them next to their partner's)."""
    kind, by_float = torch.arange(rows) % len(ROW_KINDS), float32_between(lo, hi, (rows, width), gen)
    by_value = (lo + (hi - lo) * torch.rand(rows, width, generator=gen, dtype=torch.float64)).float()
    constant = float32_between(lo, hi, (rows, 1), gen)
    at_end = torch.tensor([lo, hi], dtype=torch.float32)[torch.randint(2, (rows, 1), generator=gen)]
    constant = torch.where(torch.rand(rows, 1, generator=gen) < 0.5, at_end, constant)  # half at an
    # end of the range: where the intervals' bounds are met
    near_constant = _near(constant.expand(rows, width), gen)
    return torch.where((kind == 1)[:, None], by_value, torch.where((kind == 3)[:, None], near_constant, by_float))


def sample_inputs(inputs: dict[str, tuple[tuple[int, ...], str]], ranges: dict[str, Interval],
                  gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One point per input, of its shape and float dtype, inside its declared range (rows of each kind in turn over the
    last axis, both ends at the start); an undeclared input uniformly over its dtype's finite bit patterns."""
    env, first_of_shape = {}, {}
    for name, (shape, dtype) in inputs.items():
        if not math.prod(shape):  # a size-0 axis: an empty tensor, nothing to draw
            env[name] = torch.empty(shape, dtype=getattr(torch, dtype))
            continue
        if name not in ranges and dtype in ("float32", "float16", "bfloat16"):
            env[name] = bit_patterns(dtype, shape, gen)
            continue
        own = dtype_range(dtype)  # the points are float32 numbers: within both ranges
        lo, hi = ranges.get(name, own)
        lo, hi = max(lo, own[0], -FLOAT32_MAX), min(hi, own[1], FLOAT32_MAX)
        v = _rows(lo, hi, math.prod(shape[:-1]), shape[-1] if shape else 1, gen)
        partner = first_of_shape.setdefault(tuple(shape), v)
        if partner is not v:  # coincident rows follow the first input of this shape
            v[2::len(ROW_KINDS)] = _near(partner[2::len(ROW_KINDS)], gen)
        v.view(-1)[:2] = torch.tensor([lo, hi]).float()[: v.numel()]
        env[name] = v.clamp(lo, hi).reshape(shape).to(getattr(torch, dtype))
    return env
