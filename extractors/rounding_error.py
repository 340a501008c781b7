"""First-order rounding error of a whole program: what per-node costs cannot see, how an error travels (a cancellation
only where two operands coincide, an error tanh attenuates or exp multiplies). Each node, given operands exact in its
dtype, commits a local error Delta (Herbie's: the op in the dtype against float64; an overflow commits an infinite one),
and the output moves by |d out / d v| Delta (Higham, *Accuracy and Stability*, 2.2, 3.1). Derivatives are reverse-mode
in float64, as ADAPT (SC 2018) takes them, at points sampled from the declared ranges.

Error is in bits, as Herbie counts it: log2(1 + the floats between the result and the result moved
by its error) per output element; every bit of the word where inf or NaN replaces a finite value."""
from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
with warnings.catch_warnings(action="ignore", category=DeprecationWarning):  # forward mode's first use imports it, and
    import torch._decomp.decompositions_for_jvp  # noqa: F401 - it calls torch.jit.script: under -W error, a fallback

from egraph_opt.lang.ops import ELEMENTWISE, OPS, parse_shape
from egraph_opt.lang.program import Program
from egraph_opt.analysis.sampling import ordinal, sample_inputs
from egraph_opt.lang.term import Term, postorder

from .cost import ACCURATE_BY
from .curvature import FINITE_MAX

LOW = (torch.float32, torch.float16, torch.bfloat16)  # the dtypes whose error is counted
OUTPUTS_PER_POINT = 64  # rows of the Jacobian taken per point: a random subset of larger outputs
JACOBIAN_ELEMENTS = 2 ** 23  # fewer rows where the rows taken would hold more numbers (64 MB)


@dataclass
class RoundingError:
    """Bits of error per output element (NaN: undefined), and each rounding node's share: the most it alone causes."""
    bits: torch.Tensor
    by_node: dict[int, float]
    width: int = 32  # the output dtype's bits: an element's error where every bit is lost (a non-finite result)


@torch.enable_grad()  # derivatives are taken from the inputs
def _local_errors(root: Term, env: dict[str, torch.Tensor]) -> tuple[dict, dict, dict]:
    """Every node's exact value (float64, differentiable from the inputs), the dtype the program computes it
    in, and its local error there: the op in that dtype on operands exact in theirs, against it in float64."""
    exact, dtype, local = {}, {}, {}
    for t in postorder([root]):
        if t.op == "const":
            exact[id(t)], dtype[id(t)] = t.attrs[0], None
            continue
        if not t.args:
            v = env[t.attrs[0]]
            dtype[id(t)] = v.dtype if v.is_floating_point() else None
            exact[id(t)] = v.double() if v.is_floating_point() else v
            if t.op == "input" and v.is_floating_point():  # parameters are exact: no derivative
                exact[id(t)].requires_grad_()  # is taken through them (batch norm refuses one)
            continue
        args = [exact[id(a)] for a in t.args]
        low = [a.detach().to(dtype[id(x)]) if isinstance(a, torch.Tensor) and dtype[id(x)] else a
               for a, x in zip(args, t.args)]  # as the program holds them: rounded to their dtypes
        wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in low]
        try:
            if not any(isinstance(a, torch.Tensor) for a in args):  # folded: a Python number
                value = OPS[t.op].impl(*(torch.tensor(a, dtype=torch.float64) for a in args), *t.attrs)
                exact[id(t)], dtype[id(t)] = value.item(), None
                continue
            if t.op == "cast":  # exact arithmetic keeps every value; the program rounds it
                exact[id(t)], rounded, reference = args[0], OPS["cast"].impl(low[0], *t.attrs), wide[0]
            else:
                exact[id(t)] = OPS[t.op].impl(*args, *t.attrs)
                rounded, reference = OPS[t.op].impl(*low, *t.attrs), OPS[t.op].impl(*wide, *t.attrs)
        except (RuntimeError, IndexError) as e:  # an op without a kernel for the dtype here, no
            # derivative, or a reduction of a folded scalar (sum(exp(1.0)), which rules can spell)
            raise ValueError(f"{t.op} cannot be evaluated for its rounding error: {e}") from None
        dtype[id(t)] = rounded.dtype if rounded.is_floating_point() else None
        if dtype[id(t)] in LOW and exact[id(t)].requires_grad:
            error = (rounded.double() - reference - _dropped(t.op, wide)).abs()
            if t.op not in _DROPS and ((error == 0) & (reference != 0)).any():
                error = error + _flat(t, wide, reference)
            local[id(t)] = torch.where(error.isnan() & ~reference.isnan(), math.inf, error)
        elif dtype[id(t)] is torch.float64 and OPS[t.op].rounding == "rounds" and exact[id(t)].requires_grad:
            local[id(t)] = _dropped(t.op, wide).abs() if t.op in _DROPS else \
                _float64_error(t, wide, reference)
    return exact, dtype, local


def _float64_error(t: Term, wide: list, reference: torch.Tensor) -> torch.Tensor:
    """A float64 op's own error, which no float64 reference shows: half an ulp, but none where the op in float32
    is exact there too (1 / -1, tanh at 1e30: their neighbours' errors times a large derivative are no error), but
    where it is flat (``_flat``)."""
    single = OPS[t.op].impl(*(a.float() if isinstance(a, torch.Tensor) else a for a in wide), *t.attrs).double()
    return torch.fmin(reference.detach().abs() * 2.0 ** -53,
                      torch.fmax((single - reference.detach()).abs() * 2.0 ** -29, _flat(t, wide, reference)))


def _flat(t: Term, wide: list, reference: torch.Tensor) -> torch.Tensor:
    """How far the op's value is from its float64 one where it is flat there, moving less than half an ulp as its
    operands double: by that move (exp(1e-38) is 1 in float64, and 1e-38 from it); 0 elsewhere."""
    moved = torch.zeros(())
    for i, a in enumerate(wide):  # sum |a_i df/da_i|, in forward mode: a broadcast operand's terms stay apart
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            with contextlib.suppress(RuntimeError):  # no forward derivative: as exact as float64 finds it
                moved = moved + torch.func.jvp(lambda v: OPS[t.op].impl(*wide[:i], v, *wide[i + 1:], *t.attrs),
                                               (a.detach(),), (a.detach(),))[1].abs()
    return torch.where(moved < reference.detach().abs() * 2.0 ** -53, moved, 0.0)


_DROPS = ("add", "sub", "mul")  # the ops whose float64 error ``_dropped`` finds exactly


def _dropped(op: str, operands: list):
    """What float64 drops of a sum or product (Knuth's TwoSum, Dekker's TwoProduct): 1 + 1e-20 is 1 there too, and
    a float32 sum's error would read 0, a float64 node's none; 0 for any other op, or where not finite."""
    if op not in _DROPS:
        return 0.0
    a, b = (torch.as_tensor(v, dtype=torch.float64) for v in operands)
    if op == "mul":
        (ah, al), (bh, bl) = ((c - (c - v), v - (c - (c - v))) for v in (a, b) for c in [134217729.0 * v])
        e = ((ah * bh - a * b) + ah * bl + al * bh) + al * bl
    else:
        b = b if op == "add" else -b
        e = (a - ((s := a + b) - (s - a))) + (b - (s - a))
    return torch.where(e.isfinite(), e, 0.0)


def _jacobian_rows(out: torch.Tensor, nodes: list[torch.Tensor], pick: torch.Tensor) -> list:
    """d out[pick[k]] / d node for every k, one row per picked element (None: unused node)."""
    cotangents = torch.zeros(len(pick), out.numel(), dtype=out.dtype)
    cotangents[torch.arange(len(pick)), pick] = 1
    cotangents = cotangents.view(len(pick), *out.shape)
    try:
        return list(torch.autograd.grad(out, nodes, cotangents, is_grads_batched=True,
                                        allow_unused=True, retain_graph=True))
    except RuntimeError:  # an op without a batching rule: one row at a time
        rows = [torch.autograd.grad(out, nodes, c, allow_unused=True, retain_graph=True) for c in cotangents]
        return [None if r[0] is None else torch.stack(r) for r in zip(*rows)]


def rounding_error(root: Term, env: dict[str, torch.Tensor], gen: torch.Generator | None = None) -> RoundingError:
    """First-order error of ``root`` at ``env`` (inputs in the program's dtypes), bits per output element."""
    exact, dtype, local = _local_errors(root, env)
    out, out_dtype = exact[id(root)], dtype[id(root)]
    if out_dtype not in LOW or not isinstance(out, torch.Tensor):
        raise ValueError(f"rounding error is defined for half and single precision outputs, not {out_dtype}")
    flat = out.detach().reshape(-1)
    if not flat.numel():
        raise ValueError("an empty output has no rounding error")
    size = flat.numel() + sum(e.numel() for e in local.values())  # of one row of the Jacobian
    rows = max(1, min(OUTPUTS_PER_POINT, JACOBIAN_ELEMENTS // size, flat.numel()))
    gen = gen if gen is not None else torch.Generator().manual_seed(0)  # never the process's
    pick = torch.randperm(flat.numel(), generator=gen)[:rows] if rows < flat.numel() else torch.arange(rows)
    total = torch.zeros(rows, dtype=torch.float64)
    shares: dict[int, torch.Tensor] = {}
    if local:
        for i, g in zip(local, _jacobian_rows(out, [exact[i] for i in local], pick)):
            if g is not None:
                g = g.reshape(rows, -1)
                # a NaN derivative is 0 times an infinite or undefined one (through another
                # element's sqrt(-1), or a branch where() did not take): no path, no error carried
                shares[i] = torch.where((g == 0) | g.isnan(), 0.0,
                                        (g.abs() * local[i].reshape(-1)).nan_to_num(math.inf)).sum(1)
                total += shares[i]
    value = flat[pick]
    return RoundingError(_result_bits(value, total, out_dtype, _overflowed(root, exact, out.shape, pick)),
                         {i: float(_to_bits(value, s, out_dtype).nan_to_num(0).max()) for i, s in shares.items()},
                         torch.finfo(out_dtype).bits)


def _to_bits(value: torch.Tensor, error: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An error as the numbers between the result and the result moved by it, either way."""
    here = ordinal(value, dtype)
    apart = torch.maximum((ordinal(value - error, dtype) - here).abs(),
                          (ordinal(value + error, dtype) - here).abs()).double()
    word = torch.finfo(dtype).bits  # every bit of the word: NaN or inf for a finite value
    return torch.where(error.isfinite(), torch.log2(1 + apart), math.inf).clamp(max=word)


def _overflowed(root: Term, exact: dict, shape: torch.Size, pick: torch.Tensor) -> torch.Tensor | bool:
    """Per picked output element, whether float64 overflowed there: an op's value is infinite where its operands are
    finite (not an infinite constant, another element's overflow, an untaken where() branch); True everywhere where such
    a value does not map onto the output's elements (a reduction's operand)."""
    hit = torch.zeros(len(pick), dtype=torch.bool)
    for t in postorder([root]):
        v = exact.get(id(t))
        if not t.args or not isinstance(v, torch.Tensor) or not v.is_floating_point() or not (
                event := v.detach().isinf()).any():
            continue
        for a in (exact[id(a)] for a in t.args):
            finite = a.detach().isfinite() if isinstance(a, torch.Tensor) else torch.tensor(math.isfinite(a))
            try:
                event = event & (finite if torch.broadcast_shapes(finite.shape, event.shape) == event.shape
                                 else finite.all())
            except RuntimeError:  # a reduction's operand
                event = event & finite.all()
        try:
            hit |= event.broadcast_to(shape).reshape(-1)[pick]
        except RuntimeError:
            return bool(event.any())
    return hit


def _result_bits(value: torch.Tensor, total: torch.Tensor, dtype: torch.dtype,
                 overflowed: torch.Tensor | bool) -> torch.Tensor:
    """Bits of each output element from its first-order error ``total``; undefined (NaN, as Herbie samples) where the
    exact value is beyond the dtype: every form rounds it to inf, and counting it as 0 bits would dilute the mean."""
    bits = torch.where(value.abs() > FINITE_MAX[str(dtype).removeprefix("torch.")], math.nan, _to_bits(value, total, dtype))
    # NaN where float64 itself overflowed inside (inf / inf): the dtype, narrower, overflows there
    # too and no digit survives; NaN otherwise: undefined (sqrt of a negative), no error to count
    return torch.where(value.isnan() & overflowed, float(torch.finfo(dtype).bits),
                       torch.where(value.isnan(), math.nan, bits))


def elementwise(roots: list[Term]) -> bool:
    """Whether every op of the program is elementwise: each output element's error is its own."""
    return all(t.op in ELEMENTWISE for t in postorder(roots) if t.args)


def elementwise_bits(root: Term, env: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """Bits of error of every output element of an elementwise program at once: every value has the output's shape, so d
    out[i] / d v[j] vanishes off i == j and one backward pass gives them all. None for other programs."""
    if not elementwise([root]):
        return None
    exact, dtype, local = _local_errors(root, env)
    out, out_dtype = exact[id(root)], dtype[id(root)]
    if out_dtype not in LOW or not isinstance(out, torch.Tensor) or not out.numel() or any(
            isinstance(v, torch.Tensor) and v.requires_grad and v.shape != out.shape for v in exact.values()):
        return None
    total = torch.zeros(out.shape, dtype=torch.float64)
    if local and out.requires_grad:
        grads = torch.autograd.grad(out, [exact[i] for i in local], torch.ones_like(out), allow_unused=True)
        for i, g in zip(local, grads):
            if g is not None:  # NaN derivative: a branch where() did not take (see rounding_error)
                total += torch.where((g == 0) | g.isnan(), 0.0, (g.abs() * local[i]).nan_to_num(math.inf))
    return _result_bits(out.detach().reshape(-1), total.reshape(-1), out_dtype,
                        _overflowed(root, exact, out.shape, torch.arange(out.numel()))).reshape(out.shape)


@dataclass
class ProgramError:
    """A program's first-order error over its ranges, in bits: worst, mean, each node's worst (by term id), and the
    widest output's bits (a non-finite result's)."""
    worst: float
    mean: float
    by_node: dict[int, float]
    width: int = 32


#: an elementwise program's error per element does not depend on its shape: sampled at this many
ELEMENTWISE_SAMPLE = 256


def sampled_small(program: Program) -> bool:
    """Whether ``program`` is sampled at ``ELEMENTWISE_SAMPLE`` elements, not its own shapes: it is
    elementwise, holds no parameters, and its inputs share one larger shape."""
    shapes = {parse_shape(t.attrs[1]) for t in program.inputs}
    return len(shapes) == 1 and not program.params and math.prod(next(iter(shapes))) > ELEMENTWISE_SAMPLE \
        and elementwise(program.roots())


#: points an estimate samples: one number for every use (extraction's choice, the report's check of it, explore)
POINTS = 4


@torch.inference_mode(False)  # derivatives: a caller's inference mode would record no graph
def program_error(program: Program, ranges: dict | None = None, *, points: int = POINTS,
                  seed: int = 0) -> ProgramError | None:
    """The program's first-order error at ``points`` drawn from ``ranges`` (else every finite value
    of an input's dtype). None with opaque calls, non-float inputs, or no half or single output."""
    roots = program.roots()
    if program.opaque or any(t.op == "opaque" for t in postorder(roots)) or any(
            not getattr(torch, t.attrs[2]).is_floating_point for t in program.inputs):
        return None
    gen = torch.Generator().manual_seed(seed)
    small = sampled_small(program)  # (shape, dtype) each input is sampled at
    inputs = {t.attrs[0]: ((ELEMENTWISE_SAMPLE,) if small else parse_shape(t.attrs[1]), t.attrs[2])
              for t in program.inputs}
    bits, by_node, width = [], {}, 0
    for _ in range(points):
        env = {**program.params, **sample_inputs(inputs, ranges or {}, gen)}
        for root in roots:
            try:
                found = rounding_error(root, env, gen)
            except ValueError:
                continue
            bits.append(found.bits)
            width = max(width, found.width)
            for i, b in found.by_node.items():
                by_node[i] = max(b, by_node.get(i, 0.0))
    bits = torch.cat(bits) if bits else torch.zeros(0)
    defined = bits[~bits.isnan()]
    return ProgramError(float(defined.max()), float(defined.mean()), by_node, width) if defined.numel() else None


def least_error(candidates: list[Program], ranges: dict | None = None) -> int | None:
    """Index of the candidate of least first-order error at the same points (worst, then mean, in
    whole bits: finer is sampling noise), the first of equals; None when one is not estimable."""
    scores = []
    for i, candidate in enumerate(candidates):
        if (found := program_error(candidate, ranges)) is None:
            return None
        scores.append((round(found.worst), round(found.mean), i))
    return min(scores)[2]


def bits_gained(before: ProgramError, after: ProgramError | None) -> float:
    """The bits ``after`` is more accurate, worst's or mean's, where neither is worse or by ACCURATE_BY; else none. The
    worst's only where it is also a bit better on average or makes a non-finite result finite: float32 gelu's worst is
    an underflow (x < -9), which float64's form keeps from -8.3 on, and 0.3 bits on average bought its 3x."""
    if after is None:
        return 0.0
    mean, worst = before.mean - after.mean, before.worst - after.worst
    gain = max(mean, worst) if mean >= 1 or before.worst >= before.width > after.worst else mean
    return gain if gain >= ACCURATE_BY or min(mean, worst) >= 0 else 0.0


def lost_alike(before: ProgramError, after: ProgramError | None) -> bool:
    """Whether both lose all but a bit on average: samples where neither works (q @ k overflows) tell them not apart."""
    return after is not None and min(before.mean, after.mean) >= min(before.width, after.width) - 1


def far_more_accurate(candidates: list[Program], latencies: list[float], affordable: Callable[..., bool],
                      ranges: dict | None = None) -> int | None:
    """Index of the most accurate candidate whose sampled error is bits below the first's, worst or mean, at a latency
    ``affordable`` (``cost.buys``; under ACCURATE_BY bits, no worse in either); None where none is."""
    if (first := program_error(candidates[0], ranges)) is None or max(first.worst, first.mean) < 1:
        return None
    found = []
    for i, (candidate, latency) in enumerate(zip(candidates, latencies)):
        if i and affordable(latency, latencies[0]):
            error = program_error(candidate, ranges)
            if (gain := bits_gained(first, error)) >= 1 and affordable(latency, latencies[0], gain):
                found.append((round(error.worst), round(error.mean), latency, i))
    return min(found)[3] if found else None
