"""Regime inference, as Herbie's (``src/core/regimes.rkt``): where no single program of the root
e-class is accurate over the whole declared range, a piecewise one ``where(x < t, f1, f2)`` is.

Every candidate's first-order error (``rounding_error.elementwise_bits``) is taken at the same points, floats of the
declared ranges. For each term that can split (each input and, as Herbie's, each subterm of the output's shape: the sign
of ``x - y`` may decide where no input's range does), a dynamic program over the points sorted by its value (NaN as
+inf, where ``where`` takes the last regime) finds at most ``MAX_REGIMES`` runs of least total error plus ``SPLIT_BITS``
per extra regime and point (and per point for a subterm: it costs its ops). The branches are members of one e-class
(proven equal), so the join is exact: ``where`` only selects, and a branch overflowing off its regime is never taken.

A truncated series holds only on an interval: its relative truncation bound in the magnitude of ``within`` is added
to its error at each point and taken again over its regime's interval, which must be finite. A guarded rule's right
side whose guard the declared ranges do not prove (the quadratic formula's conjugate holds for b > 0 only) counts
``WORD`` bits where the guard fails at a point, and is taken on a regime only where range analysis proves it there
(split on a subterm: the facts about the split term over the regime, the others over the whole declared range)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from egraph_opt.analysis.ranges import analyze
from egraph_opt.analysis.sampling import from_ordinal, ordinal, sample_inputs
from egraph_opt.lang.program import Program
from egraph_opt.lang import pattern as pat
from egraph_opt.lang.term import Term, evaluate, postorder, pretty
from egraph_opt.rulesets.guards import Guard, intervals

from .rounding_error import elementwise_bits

MAX_REGIMES = 3
SPLIT_BITS = 0.25  # a regime more must save this many bits per point on average
MIN_GAIN = 0.5  # mean bits the piecewise program must save over the single best one
BUCKETS = 64  # thresholds are sought between these equal-count runs of sorted points, then refined
POINTS = 1024  # points drawn per input (Herbie's regimes sample 256)
WORD = 32.0
UNPROVED = 2 * WORD * POINTS  # more than any segment of proved forms costs: never taken there
FLOATS = ("float32", "float16", "bfloat16")  # the dtypes a regime may split on


@dataclass(frozen=True)
class Candidate:
    """A program of the root e-class; a series' ``truncation(r)``: its relative error where |within| <= r (inf past)."""
    term: Term
    rule: object = None  # the series or guarded rule it came from, if any
    within: Term | None = None
    truncation: Callable[[torch.Tensor], torch.Tensor] | None = None
    guard: Guard = Guard()  # a guarded rule's, over ``binding``
    binding: dict = field(default_factory=dict)  # its variables: Terms (operands) or numbers
    lhs: Term | None = None  # a series' or guarded rule's: the term it stands for


@dataclass(frozen=True)
class Regime:
    """``candidate.term`` computes the result where ``lo <= x < hi`` (x: the split term)."""
    lo: float
    hi: float
    candidate: Candidate
    truncation: float = 0.0  # the series' bound over the regime's interval


@dataclass(frozen=True)
class Piecewise:
    variable: Term  # the input or the subterm the regimes split
    regimes: tuple[Regime, ...]
    bits: float  # mean estimated bits of error at the sampled points
    term: Term = field(init=False)

    def __post_init__(self):
        out = self.regimes[-1].candidate.term
        for r in reversed(self.regimes[:-1]):
            out = Term("where", (Term("less", (self.variable, Term.const(r.hi))), r.candidate.term, out))
        object.__setattr__(self, "term", out)

    def describe(self) -> list[str]:
        """One line per regime: its interval of the split term, the form taken there."""
        name = pretty(self.variable)
        return [f"{name} in [{r.lo:.6g}, {r.hi:.6g}): {pretty(c.term)}"
                + (f"  [series {c.rule.name}, truncation <= {r.truncation:.2g}]" if c.truncation is not None else
                   f"  [{c.rule.name}, its guard proved here]" if c.guard else "")
                for r in self.regimes for c in [r.candidate]]


@torch.inference_mode(False)  # its error estimates take derivatives
def infer_regimes(program: Program, candidates: list[Candidate], ranges: dict | None, *, best: int = 0,
                  seed: int = 0, limit: float = math.inf, gain: float = MIN_GAIN,
                  more: Callable[[], list[Candidate]] = list) -> Piecewise | None:
    """The piecewise program of ``candidates`` (``best``: the one chosen without regimes) and ``more()`` (made only
    where ``best`` errs by ``gain`` mean bits), when it beats ``best`` by ``gain`` mean bits with each series'
    truncation within ``limit`` over its regime; else None. Inputs share one shape (``POINTS`` values each)."""
    ranges, shapes = ranges or {}, {t.attrs[1] for t in program.inputs}
    if not any(t.attrs[2] in FLOATS for t in program.inputs) or len(shapes) != 1 or program.params:
        return None
    gen = torch.Generator().manual_seed(seed)
    env = sample_inputs({t.attrs[0]: ((POINTS,), t.attrs[2]) for t in program.inputs}, ranges, gen)
    if (first := _bits(candidates[best], env)) is None:  # the e-graph's: defined where the program is
        return None
    (exact,), (root,) = evaluate([candidates[best].term], env, reference=True), program.roots()
    # as Herbie, points only where the value is one of the dtype's (every form errs 0 bits past it)
    past = (torch.as_tensor(exact).abs() > torch.finfo(program.meta()[id(root)][1]).max).expand(first.shape)
    if not float(first[~past].nan_to_num(WORD).mean()) >= gain:  # nothing to gain
        return None
    candidates, nan = candidates + more(), torch.as_tensor(evaluate([root], env, reference=True)[0]).isnan()
    columns = [first if i == best else _bits(c, env, nan) for i, c in enumerate(candidates)]
    kept = [i for i, c in enumerate(columns) if c is not None]
    bits = torch.stack([columns[i] for i in kept]).double()
    undefined = bits.isnan().all(0) | past  # undefined in every form: no error to count there
    bits = torch.where(bits.isposinf(), UNPROVED, bits.clamp(max=WORD))[:, ~undefined].nan_to_num(WORD).numpy()
    if not bits.shape[1]:
        return None
    single, candidates = float(bits[kept.index(best)].mean()), [candidates[i] for i in kept]
    series, options = [c.truncation is not None or bool(c.guard) for c in candidates], []  # bounded
    for t, x in _branch_terms(program, candidates, env):
        x, usable = x[~undefined], bits.copy()
        for k in np.flatnonzero(series) if t.op != "input" else ():  # where the split's value proves it
            b = _bound(candidates[k], program, ranges, t, x, x).numpy()
            usable[k] = np.where(np.isfinite(b) & (b <= limit), usable[k], UNPROVED)
        if found := _segments(x.numpy(), usable, series):  # a subterm's ops cost what one more regime does
            options.append((found[0] + (0.0 if t.op == "input" else SPLIT_BITS * len(x)), *found, t))
    for _, total, segments, variable in sorted(options, key=lambda o: o[0]):  # the least error first
        if total / bits.shape[1] > single - gain or len(segments) == 1 and not series[segments[0][0]]:
            return None  # too little gained, or one exact program: the re-ranking's
        if regimes := _regimes(program, candidates, ranges, variable, segments, limit):
            return Piecewise(variable, regimes, total / bits.shape[1])
    return None


def _branch_terms(program: Program, candidates: list[Candidate], env: dict) -> list[tuple[Term, torch.Tensor]]:
    """What a regime may split on, with its values at the points (float64): each float input, then (Herbie's) each other
    subterm of the candidates that is a float of the output's shape, once per structure, not a candidate."""
    out = [(t, env[t.attrs[0]].double()) for t in program.inputs if t.attrs[2] in FLOATS]
    ids = pat.structural_ids([c.term for c in candidates])
    seen, terms = {ids[id(c.term)] for c in candidates}, []
    for t in postorder([c.term for c in candidates]):
        if t.op not in ("input", "param", "const") and ids[id(t)] not in seen:
            seen.add(ids[id(t)])
            terms.append(t)
    try:
        values = evaluate(terms, env, reference=True)
    except (ValueError, RuntimeError):
        return out
    return out + [(t, v.nan_to_num(math.inf, math.inf, -math.inf)) for t, v in zip(terms, values)
                  if isinstance(v, torch.Tensor) and v.dtype == torch.float64 and v.shape == (POINTS,)]


def _regimes(program: Program, candidates: list[Candidate], ranges: dict, variable: Term,
             segments: list[tuple[int, float]], limit: float) -> tuple[Regime, ...] | None:
    """A segmentation's regimes over ``variable``; None where a series passes its radius or ``limit``, a guard fails."""
    lo, hi = ranges.get(variable.attrs[0], (-math.inf, math.inf)) if variable.op == "input" else (-math.inf, math.inf)
    regimes = []
    for k, (c, t) in enumerate(segments):
        start, end = lo if k == 0 else segments[k - 1][1], hi if k == len(segments) - 1 else t
        bound = float(_bound(candidates[c], program, ranges, variable, start, end))
        if not (math.isfinite(bound) and bound <= limit):  # past its radius or the tolerance: none
            return None
        regimes.append(Regime(start, end, candidates[c], bound))
    return tuple(regimes)


def _bits(c: Candidate, env: dict, nan: torch.Tensor | bool = False) -> torch.Tensor | None:
    """Bits of error of a candidate per element, plus its truncation in float32 ulps (inf past its radius, ``nan`` where
    the program is undefined); None where not estimable. A guarded form counts ``WORD`` bits where its guard fails."""
    try:
        found = elementwise_bits(c.term, env)
        found = found if found is None else torch.where(
            nan & ~torch.as_tensor(evaluate([c.term], env, reference=True)[0]).isnan(), math.inf, found)
    except (ValueError, RuntimeError):
        return None
    if found is not None and c.guard:
        at_point = intervals(lambda t: (torch.as_tensor(evaluate([t], env, reference=True)[0],
                                                        dtype=torch.float64),) * 2)
        ok = torch.as_tensor(c.guard.holds(c.binding, at_point)).expand(found.shape)
        found = torch.where(ok | found.isnan(), found, torch.full_like(found, WORD))  # undefined stays so
    if found is None or c.truncation is None:
        return found
    (u,) = evaluate([c.within], env, reference=True)
    u = torch.as_tensor(u, dtype=torch.float64).expand(found.shape)
    ulps = c.truncation(u.abs()) * 2.0 ** 24  # relative error over float32's smallest ulp
    return torch.where(ulps.isinf(), math.inf, torch.log2(2 ** found + ulps).clamp(max=WORD))


def _bound(c: Candidate, program: Program, ranges: dict, variable: Term, lo, hi) -> torch.Tensor:
    """A series' truncation bound where the split ``variable`` lies in [lo, hi] (numbers, or arrays: per point); for a
    guarded rule's form 0 where its guard is proved there, else inf; 0 for an exact candidate. Split on a subterm, only
    what binds that subterm is narrowed: the rest ranges over the whole declared range."""
    if c.truncation is None and not c.guard:
        return torch.tensor(0.0)
    terms = [t for t in c.binding.values() if isinstance(t, Term)] if c.guard else [c.within]
    lo, hi = torch.as_tensor(lo, dtype=torch.float64), torch.as_tensor(hi, dtype=torch.float64)
    if variable.op == "input":
        found = analyze(terms, {**ranges, variable.attrs[0]: (float(lo), float(hi))}, program.leaf_meta())
        interval = lambda t: found[id(t)]  # noqa: E731
    else:
        found, ids = analyze(terms, ranges, program.leaf_meta()), pat.structural_ids([variable, *terms])
        interval = lambda t: (lo.clamp(min=found[id(t)][0]), hi.clamp(max=found[id(t)][1])) \
            if ids[id(t)] == ids[id(variable)] else found[id(t)]  # noqa: E731
    if c.guard:
        return torch.where(torch.as_tensor(c.guard.holds(c.binding, intervals(interval))), 0.0, math.inf)
    a, b = (torch.as_tensor(v, dtype=torch.float64).abs() for v in interval(c.within))
    return c.truncation(torch.maximum(a, b))


def _segments(x: np.ndarray, bits: np.ndarray, series: list[bool]) -> tuple[float, list[tuple[int, float]]] | None:
    """(total bits, [(candidate, threshold after it)...]) of the best segmentation of the points by ``x`` (last
    threshold +inf): midway between two points, or next to a ``series``' (it holds only where sampled)."""
    order = np.argsort(x, kind="stable")
    x, bits = x[order], bits[:, order]
    n, cum = len(x), np.concatenate([np.zeros((bits.shape[0], 1)), np.cumsum(bits, 1)], 1)
    cuts = np.unique(np.searchsorted(x, x[np.linspace(0, n - 1, BUCKETS + 1).astype(int)[1:-1]]))
    edges = np.concatenate([[0], cuts[(cuts > 0) & (cuts < n)], [n]])  # between distinct values
    m = len(edges)
    span = cum[:, edges][:, None, :] - cum[:, edges][:, :, None]  # (candidate, from, to)
    seg, arg = span.min(0), span.argmin(0)
    seg = np.where(np.triu(np.ones((m, m), bool), 1), seg, np.inf)  # a segment ends after it starts
    cost = [seg[0]]  # cost[s][j]: best total over points before edges[j] in s + 1 regimes
    back = [np.zeros(m, int)]
    for _ in range(1, MAX_REGIMES):
        step = cost[-1][:, None] + seg
        back.append(step.argmin(0))
        cost.append(step.min(0))
    s, bounds = int(np.argmin([c[-1] + SPLIT_BITS * n * k for k, c in enumerate(cost)])), [m - 1]
    for level in range(s, 0, -1):
        bounds.append(back[level][bounds[-1]])
    bounds = [0] + bounds[::-1]
    picks = [int(arg[a, b]) for a, b in zip(bounds, bounds[1:])]
    segments, cuts = [], [0]
    for k, (a, b) in enumerate(zip(bounds, bounds[1:-1])):
        cut = _refine(x, cum, picks[k], picks[k + 1], edges[a], edges[b], edges[bounds[k + 2]])
        segments.append((picks[k], x[cut] if series[picks[k + 1]] else _between(x[cut - 1], x[cut], series[picks[k]])))
        cuts.append(cut)
    segments.append((picks[-1], math.inf))
    cuts.append(n)
    return float(sum(cum[c, b] - cum[c, a] for c, a, b in zip(picks, cuts, cuts[1:]))), segments


def _refine(x, cum, left: int, right: int, start: int, edge: int, stop: int) -> int:
    """The point near ``edge``, between distinct values, where ``left`` yielding to ``right`` costs least."""
    lo, hi = max(start + 1, edge - (edge - start) // 2), min(stop - 1, edge + (stop - edge) // 2)
    ks = np.arange(lo, hi + 1)
    ks = ks[x[ks - 1] < x[ks]] if len(ks) else ks
    return int(ks[np.argmin(cum[left, ks] + cum[right, stop] - cum[right, ks])]) if len(ks) else edge


def _between(a: float, b: float, next_to_a: bool = False) -> float:
    """A float32 t with a < t <= b: the middle of the floats between them, or the next above a."""
    lo, hi = (ordinal(torch.tensor([v], dtype=torch.float64), torch.float32).item() for v in (a, b))
    return from_ordinal(torch.tensor([lo + 1 if next_to_a else (lo + hi + 1) // 2]), torch.float32).item()
