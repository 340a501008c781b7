"""Torch kernels that compute an op by another formula: the same function, fewer passes or cheaper
primitives. Each is one declaration in :data:`REWRITTEN_KERNELS`; the registry gives it rows of its own in
the latency database, and binding chooses it only where it is measured faster than the op's own
kernel (never by preference). tests/test_kernels.py checks each against its reference term,
at the extremes of floating point too.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

#: tanh-gelu's constants: 0.5 x (1 + tanh(c (x + k x^3))) = x sigmoid(2c x (1 + k x^2))
_TWO_C = 2.0 * math.sqrt(2.0 / math.pi)
_K = 0.044715


def _gelu_tanh_into(y):
    """tanh-gelu of ``y`` as y * sigmoid(y (2c + 2ck y^2)), in one fresh buffer and three passes
    besides the sigmoid: sigmoid costs a third of tanh on CPU, and 1 + tanh(z) = 2 sigmoid(2z)
    has no cancellation where tanh(z) nears -1. The sign of y survives (-0, and y * +0 where the
    sigmoid underflows); y = -inf gives -inf * 0 = NaN, as the definition does. Where autograd
    records, the passes are out of place (it keeps the sigmoid's output for the backward)."""
    two_c = torch.full((), _TWO_C, dtype=y.dtype, device=y.device)
    u = torch.addcmul(two_c, y, y, value=_TWO_C * _K)
    if torch.is_grad_enabled() and y.requires_grad:
        return y * torch.sigmoid(u * y)
    return u.mul_(y).sigmoid_().mul_(y)


def gelu_tanh_sigmoid(x, approximate):
    return _gelu_tanh_into(x)


def linear_gelu_tanh_sigmoid(x, weight, bias, activation):
    return _gelu_tanh_into(F.linear(x, weight, bias))


def _only(attr: str, value: str) -> Callable:
    """limits: refuse a node whose single string attribute is not ``value``."""
    return lambda use: None if use.attrs[-1] == value else f"only {attr}={value!r}, not {use.attrs[-1]!r}"


class Declared(NamedTuple):
    name: str
    reference: str  # the op's term it computes (a pattern over the op table)
    impl: Callable
    limits: Callable
    dtypes: frozenset = frozenset({"float32", "float64"})  # narrower: each pass would round


REWRITTEN_KERNELS = [
    Declared("torch.gelu_tanh_sigmoid", "(gelu ?x0 ?approximate)", gelu_tanh_sigmoid,
             _only("approximate", "tanh")),
    Declared("torch.linear_gelu_tanh_sigmoid", "(linear_act ?x0 ?x1 ?x2 ?activation)",
             linear_gelu_tanh_sigmoid, _only("activation", "gelu_tanh")),
]
