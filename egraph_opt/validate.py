"""Validation: the optimized program must agree with the original before it is returned.

Both run on fresh random inputs of the call's signature; the yardstick is the original evaluated in
float64. The candidate passes when its error is within the dtype's tolerance or within 4x the
original's own error: rounding differs between equivalent programs, a wrong rule's error does not
stay within either.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

import torch
from torch.utils._pytree import tree_flatten

from .report import Validation

TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def random_inputs(examples: tuple, names: list[str], ranges: dict, seed: int = 0) -> tuple:
    """Inputs like ``examples`` (shape, dtype, device), drawn from declared ranges when given and
    otherwise around the examples' own scale; integer inputs stay within the examples' values."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name, x in zip(names, examples):
        if x.is_floating_point():
            if name in ranges:
                lo, hi = (max(min(v, 1e4), -1e4) for v in ranges[name])
                sample = lo + (hi - lo) * torch.rand(x.shape, generator=gen, dtype=torch.float64)
            else:
                ref = x.detach().double()
                scale = float(ref.std()) if ref.numel() > 1 and math.isfinite(float(ref.std())) else 1.0
                sample = torch.randn(x.shape, generator=gen, dtype=torch.float64) * max(scale, 1e-3)
                sample = sample + (float(ref.mean()) if torch.isfinite(ref).all() else 0.0)
            out.append(sample.to(dtype=x.dtype, device=x.device))
        elif x.dtype == torch.bool:
            out.append(torch.rand(x.shape, generator=gen).lt(0.5).to(x.device))
        else:
            lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 0)
            out.append(torch.randint(lo, hi + 1, x.shape, generator=gen, dtype=x.dtype).to(x.device))
    return tuple(out)


def _reference(fn: Callable, args: tuple):
    """The original in float64 where it can run so; otherwise in its own precision."""
    wide = tuple(a.double() if a.is_floating_point() else a for a in args)
    try:
        target = copy.deepcopy(fn).double() if isinstance(fn, torch.nn.Module) else fn
        return target(*wide)
    except Exception:  # noqa: BLE001 - a function pinned to one dtype: use its own precision
        return fn(*args)


def _error(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, str]:
    """Scale-relative max error where the reference is finite; inf if ``out`` is not finite there."""
    if not out.is_floating_point():
        return (0.0, "") if torch.equal(out, ref.to(out.dtype)) else (math.inf, "integer outputs differ")
    ref = ref.to(torch.float64)
    finite = torch.isfinite(ref)
    if not finite.any():
        return 0.0, ""
    out, ref = out.to(torch.float64)[finite], ref[finite]
    if not torch.isfinite(out).all():
        return math.inf, "non-finite values where the float64 reference is finite"
    scale = float(ref.abs().max()) or 1.0
    return float((out - ref).abs().max()) / scale, ""


def compare(original: Callable, candidate: Callable, args: tuple) -> Validation:
    with torch.no_grad():
        ref_tree = _reference(original, args)
        orig_tree, cand_tree = original(*args), candidate(*args)
    refs, spec = tree_flatten(ref_tree)
    origs, spec_o = tree_flatten(orig_tree)
    cands, spec_c = tree_flatten(cand_tree)
    if spec_c != spec_o:
        return Validation(False, math.inf, 0.0, f"output structure differs: {spec_c} vs {spec_o}")
    worst, worst_orig, detail = 0.0, 0.0, ""
    for i, (ref, orig, cand) in enumerate(zip(refs, origs, cands)):
        if not isinstance(cand, torch.Tensor):
            if cand != orig:
                return Validation(False, math.inf, 0.0, f"output {i}: {cand!r} != {orig!r}")
            continue
        if cand.shape != orig.shape or cand.dtype != orig.dtype:
            return Validation(False, math.inf, 0.0, f"output {i}: {tuple(cand.shape)} {cand.dtype} "
                                                    f"vs {tuple(orig.shape)} {orig.dtype}")
        err, why = _error(cand, ref)
        err_orig, _ = _error(orig, ref)
        allowed = max(TOLERANCE.get(cand.dtype, 0.0), 4 * err_orig)
        if err > allowed and not detail:
            detail = f"output {i}: error {err:.3g} exceeds {allowed:.3g}" + (f" ({why})" if why else "")
        worst, worst_orig = max(worst, err), max(worst_orig, err_orig)
    return Validation(not detail, worst, worst_orig, detail)
