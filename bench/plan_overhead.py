"""What a plan costs besides running it: the per-call check of its key, what a fallen-back or
unchanged model costs over eager, and the memory each extra input signature holds.

    python bench/plan_overhead.py [--calls 20000] [--model-calls 300] [--only NAME ...] [--length T] [--new N]

Key check: a 100-parameter module (50 submodules) called through the decorator against what its
plan runs (its runner, or the original where the plan changes nothing) called directly, call by
call, medians; the difference is the bind + key + lookup (goal: <= 5 us). The same for a plan that
fell back (a branch on a value cannot be traced: the original runs), against the original called
directly: what the never-slower check's fallback costs. Models (small ones, and those of
``hf_models.py`` at width 64 (``--width``), 2 layers, T=32, as users instantiate them, called positionally and by
keyword with an attention mask): eager against the decorated model whose plan fell back (its
capture made to fail: the original runs after the key check) and against its unchanged plan (no
rules: a plan that changes nothing runs the original), interleaved call by call: the median of the
paired ratios, and the fastest calls' ratio and difference (a loaded machine slows some calls,
never speeds one; goal for both: <= 2% over eager). The same for a greedy ``generate()`` of ``--new``
tokens (width 64, 2 layers) of each causal LM, its forward decorated as ``lm.forward =
saturate_and_extract(lm.forward)``: every decode step calls it with keywords and the KV cache.
Memory: resident set growth over 20 extra signatures of a 3-op function (goal: <= 20 MB each),
with and without ``keep_egraph``.
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import time
import warnings
from unittest import mock

import torch
import torch.nn as nn

import egraph_opt.drivers.api as api
from egraph_opt import saturate_and_extract
from egraph_opt.frontends.capture import CaptureError


def _rss_mb() -> float:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2 ** 20


class _Wide(nn.Module):
    """100 parameters in 50 submodules, of which the program reads one: the plan runs in a few
    microseconds, so the key check is not lost in the noise of running it."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(1, 1) for _ in range(50))

    def forward(self, x):
        return torch.exp(x) * self.layers[0].weight


class _Branching(_Wide):
    """Decides on a value: tracing refuses it, so its plan is the original."""

    def forward(self, x):
        return torch.exp(x) * self.layers[0].weight if bool(x.sum() < 1e30) else x


def key_overhead(calls: int, fallback: bool = False) -> tuple[float, int]:
    model = (_Branching() if fallback else _Wide()).eval()
    params = sum(1 for _ in model.parameters())
    f = saturate_and_extract(model, validate=False, profile_budget=0)  # never measured slower
    x = torch.randn(1, 2)
    with torch.no_grad():
        f(x)
        run = next(iter(f.plans.values())).run or model  # None: the original runs (unchanged, or fallen back)
        assert bool(f.report.fallback) == fallback, f.report.fallback
        through, direct = [], []
        for _ in range(calls):  # interleaved calls: the machine's load hits both alike
            for target, out in ((f, through), (run, direct)):
                start = time.perf_counter()
                target(x)
                out.append(time.perf_counter() - start)
    return (statistics.median(through) - statistics.median(direct)) * 1e6, params


class _MLP(nn.Sequential):
    def __init__(self, c: int = 64):
        super().__init__(nn.LayerNorm(c), nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))


def _fell_back(model: nn.Module, args: tuple, kwargs: dict):
    """``model`` decorated, its first call's capture made to fail: every call runs the original."""
    f = saturate_and_extract(model, profile_budget=0)
    with mock.patch.object(api, "capture", side_effect=CaptureError("made to fail")):
        f(*args, **kwargs)
    assert f.report.fallback
    return f


def _unchanged(model: nn.Module, args: tuple, kwargs: dict):
    """``model`` decorated with no rules: its plan changes nothing, so the original runs."""
    f = saturate_and_extract(model, rulesets=[], profile_budget=0, validate=False)
    f(*args, **kwargs)
    return f if f.report.optimized else None


def _generating(lm: nn.Module, new: int):
    """Greedy ``generate()`` of ``new`` tokens (functions of no arguments): eager's, and through a
    decorated forward whose plans fell back (their capture made to fail) or change nothing (no rules)."""
    ids, eager = torch.randint(1, 1000, (1, 8)), lm.forward

    def through(forward):
        def generate():
            lm.forward = forward
            try:
                return lm.generate(ids, max_new_tokens=new, do_sample=False, min_new_tokens=new)
            finally:
                lm.forward = eager
        return generate
    fell, same = (saturate_and_extract(eager, profile_budget=0, **options) for options in ({}, {"rulesets": []}))
    with mock.patch.object(api, "capture", side_effect=CaptureError("made to fail")):
        through(fell)()
    through(same)()
    return through(eager), {"fallback": through(fell), "unchanged": through(same)}


def model_overhead(name: str, model, args: tuple, kwargs: dict, calls: int, variants: dict | None = None) -> None:
    """One row: eager's median per call, and the fallen-back and unchanged plans' against it."""
    with torch.no_grad():
        if variants is None:
            variants = {"fallback": _fell_back(model, args, kwargs), "unchanged": _unchanged(model, args, kwargs)}
        variants = {k: v for k, v in variants.items() if v is not None}
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}  # (eager, variant)
        for f in (model, *variants.values()):
            for _ in range(3):
                f(*args, **kwargs)
        for r in range(calls):  # each variant right beside an eager call, which goes first every other
            for label, f in list(variants.items())[::1 if r % 4 < 2 else -1]:  # round, the variants' order
                # turning every two: the load and the caches treat them all alike
                pair = []
                for g in (model, f) if r % 2 else (f, model):
                    start = time.perf_counter()
                    g(*args, **kwargs)
                    pair.append(time.perf_counter() - start)
                times[label].append(tuple(pair) if r % 2 else tuple(pair[::-1]))
    eager = [e for pairs in times.values() for e, _ in pairs]
    cells = []
    for label, pairs in times.items():  # the fastest of as many eager calls (of more, it would be faster)
        v, e = min(v for _, v in pairs), min(e for e, _ in pairs)
        cells.append(f"{label} {100 * (statistics.median(v / e for e, v in pairs) - 1):+6.1f}% (fastest "
                     f"{100 * (v / e - 1):+5.1f}%, {(v - e) * 1e6:+7.1f} us)")
    print(f"{name:<26} eager {statistics.median(eager) * 1e3:7.3f} ms   {'   '.join(cells)}", flush=True)


def models(only: list[str] | None, t: int, width: int = 64):
    """(name, model, args, kwargs): the small models, then the Hugging Face ones, positionally and
    by keyword with an attention mask where they take ids."""
    yield "mlp C=64", _MLP().eval(), (torch.randn(8, 64),), {}
    yield "wide (100 parameters)", _Wide().eval(), (torch.randn(1, 2),), {}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hf_models import MODELS, inputs, instantiate

    for name in only or MODELS:
        m = instantiate(name, c=width, layers=2)
        args = inputs(name, m.config, t, padded=True)
        yield name, m, args[:1], {}
        if len(args) == 2:
            yield f"{name} (keywords, mask)", m, (), {"input_ids": args[0], "attention_mask": args[1]}


def memory_per_signature(keep: bool) -> float:
    """Shapes (n, 3n): no size family (its sizes move by 1 and 3), so each signature is a plan of its own (sizes of
    one family share one plan: they cost nothing)."""
    f = saturate_and_extract(lambda x: torch.log(1 + torch.exp(x)) * 2, keep_egraph=keep)
    for n in range(2, 6):  # warm up allocators and caches
        f(torch.randn(n, 3 * n))
    base = _rss_mb()
    for n in range(6, 26):
        f(torch.randn(n, 3 * n))
    assert len(f.plans) == 24, len(f.plans)
    return (_rss_mb() - base) / 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--model-calls", type=int, default=300)
    parser.add_argument("--only", nargs="*", help="Hugging Face architectures (default: all)")
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--new", type=int, default=64, help="tokens each generate() row makes (0: no such rows)")
    parser.add_argument("--skip-key", action="store_true", help="models only")
    parser.add_argument("--width", type=int, default=64, help="the Hugging Face models' hidden size (issue 31: 256)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    print(f"per call against eager, medians of {args.model_calls} interleaved calls, 1 thread")
    for name, model, margs, kwargs in models(args.only, args.length, args.width):
        model_overhead(name, model, margs, kwargs, args.model_calls)
    from hf_models import MODELS, causal_lm
    for name in (args.only or MODELS) if args.new else ():  # eager's plans fell back or unchanged
        lm = causal_lm(name, args.width, 2)
        if lm is not None:
            eager, variants = _generating(lm, args.new)
            model_overhead(f"{name} generate", eager, (), {}, max(args.model_calls // 10, 4), variants)
    if args.skip_key:
        return
    us, params = key_overhead(args.calls)
    print(f"key check per call, {params}-parameter module: {us:.2f} us (goal <= 5 us)")
    us, _ = key_overhead(args.calls, fallback=True)
    print(f"the same, its plan fallen back to the original: {us:.2f} us")
    for keep in (False, True):
        print(f"memory per extra signature, keep_egraph={keep}: {memory_per_signature(keep):.1f} MB"
              + (" (goal <= 20 MB)" if not keep else ""))


if __name__ == "__main__":
    main()
