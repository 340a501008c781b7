"""Validation: the optimized program must agree with the original before it is returned.

Both run on fresh random inputs of the call's signature, each on its own clones; the yardstick is
the original evaluated in float64. The candidate passes when, elementwise, it is finite where the
original is, its error is within the dtype's tolerance or within 4x the original's own error
(rounding differs between equivalent programs, a wrong rule's error does not stay within either),
and where the original is not finite it matches the original or the float64 reference.

Where float64 itself overflows (exp(800) / exp(800) is NaN there, 1 in truth), the reference is
the original's captured terms evaluated in numpy's long double (``wide_reference``: a 15-bit
exponent on x86, so exp(1e4) stays finite), when every op of it has a numpy form; else nothing
there can be checked, and a finite candidate is refused.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import operator

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from ..lang import pattern
from ..lang.ops import OPS
from ..lang.program import Program, leaves
from ..lang.term import Term, postorder


@dataclass
class Validation:
    passed: bool
    max_error: float = 0.0
    original_error: float = 0.0
    detail: str = ""


TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def random_inputs(examples: tuple, names: list[str], ranges: dict, seed: int = 0) -> tuple:
    """Inputs like ``examples`` (shape, dtype, device), drawn from declared ranges when given and
    otherwise around the examples' own scale; integer inputs are drawn among the examples' values."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name, x in zip(names, examples):
        if x.is_complex():
            out.append(torch.randn(x.shape, generator=gen, dtype=x.dtype).to(x.device))
        elif x.is_floating_point():
            if name in ranges:
                lo, hi = (max(min(v, 1e4), -1e4) for v in ranges[name])
                sample = lo + (hi - lo) * torch.rand(x.shape, generator=gen, dtype=torch.float64)
            else:
                ref = x.detach().double()
                ref = ref[ref.isfinite()]
                scale = float(ref.std()) if ref.numel() > 1 and math.isfinite(float(ref.std())) else 1.0
                sample = torch.randn(x.shape, generator=gen, dtype=torch.float64) * max(scale, 1e-3)
                sample = sample + (float(ref.mean()) if ref.numel() else 0.0)
            out.append(sample.to(dtype=x.dtype, device=x.device))
        elif x.dtype == torch.bool:
            out.append(torch.rand(x.shape, generator=gen).lt(0.5).to(x.device))
        elif x.numel():  # among the examples' own values: class targets stay classes, and an
            # ignore_index (-100) stays itself rather than an index between it and the classes
            seen = x.flatten()
            out.append(seen[torch.randint(0, seen.numel(), x.shape, generator=gen).to(seen.device)])
        else:
            out.append(x.clone())
    return tuple(out)


def _reference(fn: Callable, args: tuple):
    """The original in float64 where it can run so; otherwise in its own precision."""
    wide = tuple(a.double() if a.is_floating_point() else a.clone() for a in args)
    try:
        target = copy.deepcopy(fn).double() if isinstance(fn, torch.nn.Module) else fn
        return target(*wide)
    except Exception:  # noqa: BLE001 - a function pinned to one dtype: use its own precision
        return fn(*_clones(args))


#: numpy's long double, where it has a wider exponent than float64 (not on Windows or macOS arm)
WIDE = np.longdouble if np.finfo(np.longdouble).maxexp > np.finfo(np.float64).maxexp else None
_OPERATORS = {operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.pow}


def wide_reference(program: Program, args: tuple) -> list | None:
    """The original program's outputs (flattened) in long double, as float64 arrays: finite where
    float64 overflows only in between. None where it cannot be had: no wider type, an opaque
    call, a parameter, or an op with no numpy form (``Op.numpy``, or an arithmetic operator)."""
    outputs = leaves(program.outputs)
    if WIDE is None or program.opaque or not all(isinstance(o, Term) for o in outputs) or \
            not all(a.is_floating_point() for a in args):
        return None
    values: dict[int, object] = {id(t): a.detach().double().cpu().numpy().astype(WIDE)
                                 for t, a in zip(program.inputs, args)}
    if not _evaluate_wide(outputs, values, []):
        return None
    return [np.asarray(values[id(o)]).astype(np.float64) for o in outputs]


def _evaluate_wide(roots: list[Term], values: dict[int, object], expanded: list[Term]) -> bool:
    """Fill ``values`` (by term id) for ``roots`` in long double; an op with no numpy form is
    evaluated in float64 where its values are bounded, else as the definition in primitives it
    declares (hypot as sqrt(x^2 + y^2), which long double's range cannot overflow on float64
    values), each kept in ``expanded`` while ``values`` holds its id. False where none holds.
    (A numpy form is also a numpy kernel: numpy's float32 arctan, bound by cost, rounded worse.)"""
    for t in postorder(roots):
        spec = OPS[t.op]
        if id(t) in values:
            continue
        if t.op == "const":
            values[id(t)] = WIDE(t.attrs[0])
        elif spec.numpy or spec.impl in _OPERATORS:
            fn = getattr(np, spec.numpy) if spec.numpy else spec.impl
            with np.errstate(all="ignore"):
                values[id(t)] = fn(*(values[id(a)] for a in t.args))
        elif spec.bounds is not None and not t.attrs:  # elementwise and bounded (atan): no
            # overflow to escape, and float64's rounding is far below the float32 errors judged
            wide = [torch.as_tensor(np.asarray(values[id(a)], dtype=np.float64)) for a in t.args]
            values[id(t)] = np.asarray(spec.impl(*wide)).astype(WIDE)
        elif spec.definition:
            bindings = {f"x{i}": a for i, a in enumerate(t.args)}
            bindings.update((name, value) for (name, _), value in zip(spec.attrs, t.attrs))
            body = pattern.instantiate(pattern.parse(spec.definition), bindings)
            expanded.append(body)
            if not _evaluate_wide([body], values, expanded):
                return False
            values[id(t)] = values[id(body)]
        else:
            return False
    return True


def _clones(args: tuple) -> tuple:
    """Each run gets its own inputs: a program that writes into them must not feed the next."""
    return tuple(a.clone() for a in args)


def _widened(ref, wide: np.ndarray):
    """The float64 reference, with the long double one where float64 is not finite."""
    if not isinstance(ref, torch.Tensor) or not ref.is_floating_point() or ref.is_complex():
        return ref
    fill = torch.as_tensor(np.broadcast_to(wide, tuple(ref.shape)).copy()).to(ref.dtype)
    return torch.where(ref.isfinite(), ref, fill.to(ref.device))


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal values, both NaN, or the same infinity (signs kept)."""
    return (a == b) | (a.isnan() & b.isnan())


def judge(cand, orig, ref=None) -> tuple[bool, float, float, str]:
    """The acceptance rule, for torch and ONNX outputs alike (numpy arrays are taken as tensors):
    (accepted, candidate's error, original's error, why refused). Without a float64 ``ref`` (an
    ONNX model runs in its own precision), the original is the reference."""
    if isinstance(cand, np.ndarray) and cand.dtype.kind not in "biufc":  # strings, objects
        same = cand.shape == orig.shape and np.array_equal(cand, orig)
        return same, 0.0 if same else math.inf, 0.0, "" if same else "outputs differ"
    cand, orig = (torch.from_numpy(t) if not isinstance(t, torch.Tensor) else t for t in (cand, orig))
    ref = orig if ref is None else torch.from_numpy(ref) if not isinstance(ref, torch.Tensor) else ref
    if cand.shape != orig.shape or cand.dtype != orig.dtype:
        return False, math.inf, 0.0, (f"{tuple(cand.shape)} {cand.dtype} vs "
                                      f"{tuple(orig.shape)} {orig.dtype}")
    err, err_orig, why = _error(cand, orig, ref)
    allowed = max(TOLERANCE.get(cand.dtype, TOLERANCE.get(cand.real.dtype, 0.0)), 4 * err_orig)
    if not why and err > allowed:
        why = f"error {err:.3g} exceeds {allowed:.3g}"
    return not why, err, err_orig, why


def _error(cand: torch.Tensor, orig: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, str]:
    """(candidate's error, original's error, why refused or ""), relative to the float64 reference's
    largest finite magnitude, over elements where the original and the reference are finite (an
    infinite error of the original never excuses one). Where the original is finite the candidate
    must be; where it is not, the candidate must match it or the (finite) reference."""
    if cand.is_complex():
        cand, orig, ref = (torch.view_as_real(t.resolve_conj()) for t in (cand, orig, ref.to(cand.dtype)))
    if not cand.is_floating_point():
        return (0.0, 0.0, "") if torch.equal(cand, orig) else (math.inf, 0.0, "integer outputs differ")
    cand, orig, ref = (t.to(torch.float64) for t in (cand, orig, ref))
    orig_finite, ref_finite, cand_finite = orig.isfinite(), ref.isfinite(), cand.isfinite()
    if (orig_finite & ~cand_finite).any():
        return math.inf, 0.0, "non-finite values where the original is finite"
    both = orig_finite & ref_finite
    rescued = ~orig_finite & ref_finite & cand_finite  # finite where only the original overflowed
    scale = float(ref[both | rescued].abs().max()) if (both | rescued).any() else 1.0
    scale = scale or 1.0
    err = float((cand - ref)[both | rescued].abs().max()) / scale if (both | rescued).any() else 0.0
    err_orig = float((orig - ref)[both].abs().max()) / scale if both.any() else 0.0
    odd = ~orig_finite & ~rescued & ~_same(cand, orig) & ~_same(cand, ref)
    if odd.any():
        return err, err_orig, (f"{int(odd.sum())} element(s) where the original is not finite "
                               "differ from both it and the float64 reference")
    return err, err_orig, ""


def compare(original: Callable, candidate: Callable, args: tuple, wide: list | None = None) -> Validation:
    """Run both on their own clones of ``args`` (random draws inside them do not advance the
    caller's generator) and apply the acceptance rule, ``judge``; ``wide`` (``wide_reference``)
    stands in for the float64 reference where that is not finite."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        ref_tree = _reference(original, args)
        orig_tree, cand_tree = original(*_clones(args)), candidate(*_clones(args))
    (refs, _), (origs, spec_o), (cands, spec_c) = map(tree_flatten, (ref_tree, orig_tree, cand_tree))
    if wide is not None and len(wide) == len(refs):
        refs = [_widened(r, w) for r, w in zip(refs, wide)]
    if spec_c != spec_o:
        return Validation(False, math.inf, 0.0, f"output structure differs: {spec_c} vs {spec_o}")
    worst, worst_orig, detail = 0.0, 0.0, ""
    for i, (ref, orig, cand) in enumerate(zip(refs, origs, cands)):
        if not isinstance(cand, torch.Tensor):
            if cand != orig:
                return Validation(False, math.inf, 0.0, f"output {i}: {cand!r} != {orig!r}")
            continue
        ok, err, err_orig, why = judge(cand, orig, ref)
        if not ok and not detail:
            detail = f"output {i}: {why}"
        worst, worst_orig = max(worst, err), max(worst_orig, err_orig)
    return Validation(not detail, worst, worst_orig, detail)
