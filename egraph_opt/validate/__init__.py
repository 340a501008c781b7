"""Validation: the optimized program must agree with the original before it is returned.

Both run on fresh random inputs of the call's signature, each on its own clones, judged (``judge``) against the
original evaluated in float64: rounding differs between equivalent programs, a wrong rule's error does not stay within
the dtype's tolerance or 4x the original's own. Where float64 overflows too, the long double reference stands in
(``wide_reference``); the references' work is bounded (``_bounded_reference``), and ``Validation.bounded`` says how."""
from __future__ import annotations

import math
import time
from dataclasses import KW_ONLY, dataclass, fields, is_dataclass
import operator
from typing import Callable

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from ..lang import pattern
from ..lang.ops import OPS
from ..lang.program import Program, leaves
from ..kernels.torch_ops import TORCH
from ..lang.term import Term, evaluate, postorder


@dataclass
class Validation:
    passed: bool
    _: KW_ONLY
    max_error: float = 0.0
    original_error: float = 0.0
    detail: str = ""
    bounded: str = ""  # how the reference work was bounded; "" where it covered every element
    written: tuple[int, ...] = ()  # the arguments the original wrote into (its run on clones)
    original_s: float = 0.0  # seconds of that run: what one call of the original costs


#: seconds the float64 reference may take (its parameters' conversion included): beyond them it
#: covers the batch's first rows, or none, and the rest is judged against the original
REFERENCE_SECONDS = 5.0
#: the float64 reference's cost as a multiple of the original's run (float64 arithmetic)
FLOAT64_COST = 2.0
#: the long double reference (numpy without BLAS: ~0.35 GFLOP/s) runs on programs of at most this
#: many values over all their terms
WIDE_ELEMENTS = 1 << 21
#: where only the sampled rows have a reference, the others' distance from the original may be this many times the
#: original's error on the sample: within 4x of the reference (triangle inequality) where it errs there as on the sample
EXCUSED = 3.0

TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _flattened(tree) -> tuple[list, object]:
    """pytree's leaves and structure, dataclass fields opened (pytree compares one whole by ``==``: tensors refuse)."""
    def opened(x):
        return (type(x), {f.name: tree_map(opened, getattr(x, f.name), is_leaf=_dataclass) for f in fields(x)}) \
            if _dataclass(x) else x
    return tree_flatten(tree_map(opened, tree, is_leaf=_dataclass))


def _dataclass(x) -> bool:
    return is_dataclass(x) and not isinstance(x, type)


def random_inputs(examples: tuple, names: list[str], ranges: dict, seed: int = 0) -> tuple:
    """Inputs like ``examples``: from declared ranges, else around the examples' scale; integers among their values."""
    gen, out = torch.Generator().manual_seed(seed), []
    for name, x in zip(names, examples):
        if x.is_complex():
            out.append(torch.randn(x.shape, generator=gen, dtype=x.dtype).to(x.device))
        elif x.is_floating_point():
            if name in ranges:
                lo, hi = (max(min(v, 1e4), -1e4) for v in ranges[name])
                sample = lo + (hi - lo) * torch.rand(x.shape, generator=gen, dtype=torch.float64)
            else:
                ref = x.detach().double()[x.detach().isfinite()]
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
    """The original in float64 (a module on float64 copies of its state) where it runs so, else in its own precision."""
    wide = tuple(a.double() if a.is_floating_point() else a.clone() for a in args)
    try:
        if not isinstance(fn, torch.nn.Module):
            return fn(*wide)
        state = {n: t.double() if t.is_floating_point() else t
                 for n, t in (*fn.named_parameters(), *fn.named_buffers())}
        return torch.func.functional_call(fn, state, wide)
    except _OutOfTime:
        raise
    except Exception:  # noqa: BLE001 - a function pinned to one dtype: use its own precision
        return fn(*_clones(args))


class _OutOfTime(Exception):
    pass


class _Deadline(TorchFunctionMode):
    """Stops its program at the first torch call past ``end`` (on CUDA, syncing every 64 calls: queued work counts)."""

    def __init__(self, end: float, sync: Callable):
        super().__init__()
        self.end, self.sync, self.calls = end, sync, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        if self.calls % 64 == 0:
            self.sync()
        if time.perf_counter() > self.end:
            raise _OutOfTime()
        return func(*args, **(kwargs or {}))


#: numpy's long double, where it has a wider exponent than float64 (not on Windows or macOS arm)
WIDE = np.longdouble if np.finfo(np.longdouble).maxexp > np.finfo(np.float64).maxexp else None
_OPERATORS = {operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.pow}


def wide_reference(program: Program, args: tuple) -> list | None:
    """The original program's outputs in long double, as float64 arrays: finite where float64 overflows only in between.
    None without a wider type, for an opaque call, a parameter, an op with no numpy form, over ``WIDE_ELEMENTS``."""
    outputs = leaves(program.outputs)
    if WIDE is None or program.opaque or not all(isinstance(o, Term) for o in outputs) or \
            not all(a.is_floating_point() for a in args) or \
            sum(math.prod(shape) for shape, _ in program.meta().values()) > WIDE_ELEMENTS:
        return None
    values: dict[int, object] = {id(t): a.detach().double().cpu().numpy().astype(WIDE)
                                 for t, a in zip(program.inputs, args)}
    return [np.asarray(values[id(o)]).astype(np.float64) for o in outputs] if _evaluate_wide(outputs, values, []) else None


def _evaluate_wide(roots: list[Term], values: dict[int, object], expanded: list[Term]) -> bool:
    """Fill ``values`` (by term id) for ``roots`` in long double; an op with no numpy form is evaluated in float64 where
    its values are bounded, else as the definition in primitives it declares (hypot as sqrt(x^2 + y^2): long double's
    range cannot overflow on float64 values), kept in ``expanded`` while ``values`` holds its id. False: none holds."""
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
            wide = [torch.as_tensor(v.astype(np.float64) if v.dtype.kind == "f" else v)  # a comparison
                    for v in (np.asarray(values[id(a)]) for a in t.args)]  # stays boolean: where's condition
            out = np.asarray(spec.impl(*wide))
            values[id(t)] = out.astype(WIDE) if out.dtype.kind == "f" else out
        elif spec.definition:
            body = pattern.defined(t)
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


def run_counting_writes(fn: Callable, args: tuple, sync: Callable = lambda: None) -> tuple:
    """``fn`` run once on clones that count writes (``_version``): its output, the arguments it wrote, its seconds."""
    with torch.inference_mode(False):  # inference tensors count no versions
        clones = _clones(args)
    versions, start = [c._version for c in clones], time.perf_counter()
    out = fn(*clones)
    sync()
    seconds = time.perf_counter() - start
    return out, tuple(i for i, (c, v) in enumerate(zip(clones, versions)) if c._version != v), seconds


def _widened(ref, wide: np.ndarray):
    """The float64 reference, with the long double one where float64 is not finite."""
    if not isinstance(ref, torch.Tensor) or not ref.is_floating_point() or ref.is_complex():
        return ref
    fill = torch.as_tensor(np.broadcast_to(wide, tuple(ref.shape)).copy()).to(ref.dtype)
    return torch.where(ref.isfinite(), ref, fill.to(ref.device))


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal values, both NaN, or the same infinity (signs kept)."""
    return (a == b) | (a.isnan() & b.isnan())


def judge(cand, orig, ref=None, excused: float = 0.0) -> tuple[bool, float, float, str]:
    """The acceptance rule, for torch and ONNX (numpy) outputs alike: (accepted, candidate's error, original's error,
    why refused). Without a float64 ``ref`` the original is the reference; ``excused``: an error allowed besides."""
    if isinstance(cand, np.ndarray) and cand.dtype.kind not in "biufc":  # strings, objects
        same = cand.shape == orig.shape and np.array_equal(cand, orig)
        return same, 0.0 if same else math.inf, 0.0, "" if same else "outputs differ"
    cand, orig = map(torch.as_tensor, (cand, orig))
    ref = orig if ref is None else torch.as_tensor(ref)
    if cand.shape != orig.shape or cand.dtype != orig.dtype:
        return False, math.inf, 0.0, (f"{tuple(cand.shape)} {cand.dtype} vs {tuple(orig.shape)} {orig.dtype}")
    err, err_orig, why = _error(cand, orig, ref)
    allowed = max(TOLERANCE.get(cand.dtype, TOLERANCE.get(cand.real.dtype, 0.0)), 4 * err_orig, excused)
    if not why and err > allowed:
        why = f"error {err:.3g} exceeds {allowed:.3g}"
    return not why, err, err_orig, why


def imported_reference(program: Program, feeds: dict, expected: list) -> list[np.ndarray] | None:
    """The float64 reference of an imported model (``expected``: its outputs on ``feeds``), so a stability fix is
    accepted: its terms in float64 (long double where it overflows), if they reproduce ``expected``."""
    outputs = leaves(program.outputs)
    if program.opaque or not all(isinstance(o, Term) for o in outputs):
        return None
    inputs = tuple(torch.from_numpy(np.asarray(feeds[t.attrs[0]])) for t in program.inputs)
    env = {**program.params, **{t.attrs[0]: x for t, x in zip(program.inputs, inputs)}}
    try:
        own = evaluate(outputs, env, kernels=TORCH)
        refs = [torch.as_tensor(r) for r in evaluate(outputs, env, reference=True)]
    except Exception:  # noqa: BLE001 - shapes the import fixed differ from these: no reference
        return None
    if not all(judge(torch.as_tensor(o), e)[0] for o, e in zip(own, expected)):
        return None
    if any(r.is_floating_point() and not r.isfinite().all() for r in refs):
        if (wide := wide_reference(program, inputs)) is not None:
            refs = [_widened(r, w) for r, w in zip(refs, wide)]
    return [r.numpy() for r in refs]


def _error(cand: torch.Tensor, orig: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, str]:
    """(candidate's error, original's error, why refused or ""), relative to the float64 reference's largest finite
    magnitude, where the original and the reference are finite (an infinite error of the original never excuses one).
    Where the original is finite the candidate must be; elsewhere it must match it or the (finite) reference."""
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
    scale = float(ref[both | rescued].abs().max()) or 1.0 if (both | rescued).any() else 1.0
    err = float((cand - ref)[both | rescued].abs().max()) / scale if (both | rescued).any() else 0.0
    err_orig = float((orig - ref)[both].abs().max()) / scale if both.any() else 0.0
    if (odd := ~orig_finite & ~rescued & ~_same(cand, orig) & ~_same(cand, ref)).any():
        return err, err_orig, (f"{int(odd.sum())} element(s) where the original is not finite "
                               "differ from both it and the float64 reference")
    return err, err_orig, ""


def compare(original: Callable, candidate: Callable, args: tuple, wide: list | Callable | None = None,
            budget_s: float | None = None, writes: tuple[int, ...] = ()) -> Validation:
    """Run both on their own clones of ``args`` (capture refuses random draws: forking the generator would rewind other
    threads') and ``judge`` them against the float64 reference bounded by ``budget_s``; ``wide`` (``wide_reference``, or
    a function giving it) stands in where it overflows. ``writes``: the arguments both write back, judged as outputs."""
    budget_s = REFERENCE_SECONDS if budget_s is None else budget_s
    on_cuda = any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args)
    sync = torch.cuda.synchronize if on_cuda else lambda: None  # queued kernels count
    if writes:
        original, candidate = ((lambda *a, f=f: (f(*a), [a[i] for i in writes])) for f in (original, candidate))
    with torch.no_grad():
        orig_tree, written, seconds = run_counting_writes(original, args, sync)
        if written := tuple(i for i in written if i not in writes):
            return Validation(False, max_error=math.inf, detail="the original writes into its arguments",
                              written=written, original_s=seconds)
        (origs, spec_o), (cands, spec_c) = map(_flattened, (orig_tree, candidate(*_clones(args))))
        if spec_c != spec_o:
            return Validation(False, max_error=math.inf, original_s=seconds,
                              detail=f"output structure differs: {spec_c} vs {spec_o}")
        reference = _bounded_reference(original, args, origs, seconds, budget_s, sync)
    return _judged(origs, cands, reference, wide, seconds)


def _judged(origs: list, cands: list, reference, wide, seconds: float) -> Validation:
    """``judge`` on each output against the (widened) float64 reference, else the original (unsampled rows)."""
    refs, rows, alone, bounded = reference.refs, reference.rows, reference.alone, reference.bounded
    if refs is not None and wide is not None and any(
            isinstance(r, torch.Tensor) and r.is_floating_point() and not r.isfinite().all() for r in refs):
        wide = wide() if callable(wide) else wide
        if wide is not None and len(wide) == len(refs):
            refs = [_widened(r, w if rows is None else w[:rows]) for r, w in zip(refs, wide)]
    worst, worst_orig, detail = 0.0, 0.0, ""
    for i, (orig, cand) in enumerate(zip(origs, cands)):
        if not isinstance(cand, torch.Tensor):
            if cand != orig:
                return Validation(False, max_error=math.inf, detail=f"output {i}: {cand!r} != {orig!r}",
                                  bounded=bounded, original_s=seconds)
            continue
        if rows is None:  # every row against the reference (without one: the original)
            verdicts = [judge(cand, orig, None if refs is None else refs[i])]
        else:  # the sampled rows against the reference (the original's error: on them alone),
            head = judge(cand[:rows], alone[i], refs[i])  # the others against the original
            verdicts = [head, judge(cand[rows:], orig[rows:], excused=EXCUSED * head[2])]
        for ok, err, err_orig, why in verdicts:
            if not ok and not detail:
                detail = f"output {i}: {why}"
            worst, worst_orig = max(worst, err), max(worst_orig, err_orig)
    return Validation(not detail, max_error=worst, original_error=worst_orig, detail=detail, bounded=bounded,
                      original_s=seconds)


@dataclass
class _Reference:
    refs: list | None  # the float64 reference's flat outputs; None: none within the bound
    rows: int | None = None  # the batch's first rows they cover; None: every row
    alone: list | None = None  # the original's outputs on those rows alone
    bounded: str = ""


def _none(why: str) -> _Reference:
    return _Reference(None, bounded=f"no float64 reference: {why}; every element is judged against the original")


def _bounded_reference(original: Callable, args: tuple, origs: list, seconds: float, budget_s: float,
                       sync: Callable) -> _Reference:
    """The float64 reference of every row where ``FLOAT64_COST`` times the original's ``seconds`` fits ``budget_s``;
    else of the batch's first rows, as many as fit, where every output and some input are batched alike and the
    original on those rows alone agrees with its rows of the whole; else none. A deadline holds the runs to it."""
    estimate, batch = FLOAT64_COST * seconds, _batch(args, origs)
    rows = None if estimate <= budget_s else max(1, int(batch * budget_s / estimate)) if batch else 0
    if rows == 0:
        return _none(f"it would take about {estimate:.1f} s, over its {budget_s:g} s bound, and the "
                     "batch cannot be split")
    part = args if rows is None else tuple(a[:rows] if _batched(a, batch) else a for a in args)
    try:
        with _Deadline(time.perf_counter() + budget_s, sync):
            refs, _ = _flattened(_reference(original, part))
            if rows is None:
                return _Reference(refs)
            alone, _ = _flattened(original(*_clones(part)))
    except _OutOfTime:
        return _none(f"it ran past its {budget_s:g} s bound")
    except Exception as e:  # noqa: BLE001 - the rows alone do not run (shapes fixed in the code)
        if rows is None:
            raise
        return _none(f"the first {rows} rows alone do not run ({type(e).__name__})")
    if not all(judge(o[:rows], a, r)[0] for o, a, r in zip(origs, alone, refs) if isinstance(o, torch.Tensor)):
        return _none(f"the original on its first {rows} rows alone differs from its rows of the whole batch")
    return _Reference(refs, rows=rows, alone=alone, bounded=f"float64 reference on {rows} of {batch} rows (about "
                      f"{estimate:.1f} s for all, over its {budget_s:g} s bound); the other rows are judged "
                      "against the original")


def _batched(a, batch: int) -> bool:
    return isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == batch


def _batch(args: tuple, origs: list) -> int:
    """The rows the reference can be split by: the outputs' one first dimension (> 1) an argument shares; else 0."""
    sizes = {o.shape[0] if o.dim() else 0 for o in origs if isinstance(o, torch.Tensor)}
    batch = sizes.pop() if len(sizes) == 1 else 0
    return batch if batch > 1 and any(_batched(a, batch) for a in args) else 0
