"""The profiler: times kernels and records the medians in the profiling database.

`SPECS` (from the work kind each op declares) gives each costed op's example shapes for a size and
its work (FLOPs, elements moved); the latency model reads the same table, so they agree."""
from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np
import torch

from ..analysis.layouts import with_layout
from ..lang.ops import OPS
from .profile_db import ProfileDB, Record

Shapes = tuple[tuple[int, ...], ...]


class Work(NamedTuple):
    """What a kernel must do: floating-point operations and tensor elements read plus written."""
    flops: float
    elements: float


def _pointwise(flops_per_element: float):
    def work(shapes, attrs):
        out = math.prod(torch.broadcast_shapes(*shapes))
        return Work(flops_per_element * out, sum(map(math.prod, shapes)) + out)
    return work


def _along_axis(flops_per_element: float, reduces: bool):
    """Reads every element once; writes one per reduced row (a reduction) or all (softmax)."""
    def work(shapes, attrs):
        (shape,) = shapes
        n = math.prod(shape)
        return Work(flops_per_element * n, n + (n // max(shape[attrs["axis"]], 1) if reduces else n))
    return work


def _batch_matmul(a, b) -> tuple[int, int, int, int]:
    """(batch, m, k, n) of `a @ b`, with matmul's 1-D promotion and batch broadcasting."""
    a, b = (1, *a) if len(a) == 1 else tuple(a), (*b, 1) if len(b) == 1 else tuple(b)
    if a[-1] != b[-2]:
        raise ValueError(f"matmul of shapes {a} and {b}: inner dimensions {a[-1]} != {b[-2]}")
    return math.prod(torch.broadcast_shapes(a[:-2], b[:-2])), a[-2], a[-1], b[-1]


def _matmul(shapes, attrs):
    batch, m, k, n = _batch_matmul(*shapes)
    return Work(2.0 * batch * m * k * n, sum(map(math.prod, shapes)) + batch * m * n)


def _linear(shapes, attrs):
    x, w, *added = shapes  # the bias, and linear_add's residual: a FLOP an output each
    batch, m, k, n = _batch_matmul(x, tuple(reversed(w)))
    return Work(2.0 * batch * m * k * n + len(added) * batch * m * n, sum(map(math.prod, shapes)) + batch * m * n)


def _norm(flops_per_element: float):
    """Reads x and its weights once, writes x's size."""
    def work(shapes, attrs):
        n = math.prod(shapes[0])
        return Work(flops_per_element * n, 2 * n + sum(map(math.prod, shapes[1:])))
    return work


def _sdpa(shapes, attrs):
    """Flash-style attention: scores are never written; a causal mask halves the work."""
    q, k, v = shapes[:3]
    kv = [s[:-3] + (1,) if min(len(s), len(q)) > 2 and s[-3] < q[-3] else s[:-2] for s in (k, v)]  # grouped
    batch, (length, e), (s, ev) = math.prod(torch.broadcast_shapes(q[:-2], *kv)), q[-2:], v[-2:]
    pairs = batch * length * s * (0.5 if attrs.get("causal") else 1.0)
    return Work(pairs * (2 * e + 2 * ev + 12), sum(map(math.prod, shapes)) + batch * length * ev)


def _attention(op) -> OpSpec:
    """q, k and v of (1, 8, n, 64), then (n, n) masks: True where the op's definition selects by them, else zeros."""
    conditions = {i for i in range(3, op.arity) if f"(where ?x{i} " in (op.definition or "")}
    def inputs(shapes, dtype, device):
        return _positive(shapes[:3], dtype, device) + [torch.ones(s, dtype=torch.bool, device=device) if i in conditions
                                                       else torch.zeros(s, dtype=dtype, device=device)
                                                       for i, s in enumerate(shapes[3:], 3)]
    return OpSpec(lambda n: ((1, 8, n, 64),) * 3 + ((n, n),) * (op.arity - 3), _sdpa, inputs)


def _square(count: int):
    return lambda n: ((n, n),) * count


def _generator(device) -> torch.Generator:
    """Profiling's own random numbers, on the device: not the process's (other threads draw), not the host's (slow)."""
    return torch.Generator(device).manual_seed(0)


def _positive(shapes, dtype, device):
    """Inputs in [0.5, 1.5): in the domain of every op (log, sqrt, pow), so no NaN slows a run."""
    gen = _generator(device)
    return [torch.rand(s, generator=gen, dtype=dtype, device=device) + 0.5 for s in shapes]


def _where_inputs(shapes, dtype, device):
    cond, *values = shapes  # a condition true for about half the elements
    return [_positive([cond], dtype, device)[0] < 1.0, *_positive(values, dtype, device)]


def _loss(flops_per_element: float):
    """Reads every logit once, and a target per row; writes one loss (or one per row)."""
    def work(shapes, attrs):
        logits, target = shapes
        return Work(flops_per_element * math.prod(logits), math.prod(logits) + 2 * math.prod(target))
    return work


def _loss_inputs(shapes, dtype, device):
    """Logits and class indices (every row's target one of its classes)."""
    (logits, target), gen = shapes, _generator(device)
    return [torch.randn(logits, generator=gen, dtype=dtype, device=device),
            torch.randint(0, max(logits[1], 1), target, generator=gen, device=device)]


@dataclass(frozen=True)
class OpSpec:
    """How to profile one op (example shapes for a size n, inputs) and what it costs (work)."""
    shapes: Callable[[int], Shapes]
    work: Callable[[Shapes, Mapping[str, object]], Work]
    inputs: Callable = _positive


#: how to profile and price each work kind an op declares (``Op.work``); the per-element kinds take its FLOPs per
#: element (``Op.flops``): 1 for arithmetic, 10 for a transcendental (a polynomial of ~10 terms), 12 for softmax-like
#: ops. Ops of kind "static" are not profiled: costs count their passes over memory.
WORK_KINDS: dict[str, Callable] = {
    "pointwise": lambda op: OpSpec(_square(op.arity), _pointwise(op.flops)),
    "select": lambda op: OpSpec(_square(op.arity), _pointwise(op.flops), _where_inputs),
    "reduce": lambda op: OpSpec(_square(1), _along_axis(op.flops, reduces=True)),
    "along": lambda op: OpSpec(_square(1), _along_axis(op.flops, reduces=False)),
    "matmul": lambda op: OpSpec(_square(2), _matmul),
    "linear": lambda op: OpSpec(lambda n: ((n, n), (n, n), (n,), (n, n))[:op.arity], _linear),
    "layer_norm": lambda op: OpSpec(lambda n: ((n, n), (n,), (n,)), _norm(8.0)),
    "rms_norm": lambda op: OpSpec(lambda n: ((n, n), (n,)), _norm(4.0)),
    "sdpa": _attention,
    "loss": lambda op: OpSpec(lambda n: ((n, n), (n,)), _loss(op.flops), _loss_inputs)}
SPECS: dict[str, OpSpec] = {name: WORK_KINDS[op.work](op) for name, op in OPS.items()
                            if not op.is_leaf and op.work != "static"}
#: moving a value between backends' memory (the kernels of ``kernels.registry.MOVES``): no op of
#: the program, a kernel all the same, priced by the elements it touches
MOVE = "move"
#: every kind of kernel the latency model prices: the ops of SPECS and the moves
PRICED: dict[str, OpSpec] = {**SPECS, MOVE: OpSpec(_square(1), _pointwise(0.0))}
# Attribute values used when profiling (sdpa's scale is 1/sqrt(64) for its head size of 64).
EXAMPLE_ATTRS = {"axis": -1, "keepdim": False, "correction": 1, "approximate": "none", "eps": 1e-5, "scale": 0.125,
                 "causal": False, "fill": -1e30, "floor": -1e30, "beta": 1.702, "activation": "gelu_tanh",
                 "reduction": "mean", "ignore_index": -100}


def timeable(op: str, shapes) -> bool:
    """Whether ``op`` on tensors of ``shapes`` is the call profiled: a constant operand (``x + 1.0``) is not."""
    return len(shapes) == len(PRICED[op].shapes(1))


def attr_names(kernel: str) -> list[str]:
    """The attributes a kernel of PRICED takes, in order (a move takes none)."""
    return [name for name, _ in OPS[kernel].attrs] if kernel in OPS else []


def work(kernel: str, shapes: Sequence[Sequence[int]], attrs: Mapping[str, object]) -> Work:
    """The work of `kernel` (an op of SPECS, a move, a region's kernel: elements read and written) at these shapes."""
    if kernel not in PRICED and not kernel.startswith("generated_"):
        raise ValueError(f"no work formula for kernel {kernel!r}; known: {', '.join(sorted(PRICED))}")
    if missing := [name for name in attr_names(kernel) if name not in attrs]:
        raise ValueError(f"kernel {kernel!r} needs attributes {missing}, got {dict(attrs)}")
    return PRICED.get(kernel, PRICED[MOVE]).work(tuple(tuple(s) for s in shapes), attrs)


def torch_dtype(name: str) -> torch.dtype:
    if not isinstance(dtype := getattr(torch, name, None), torch.dtype):
        raise ValueError(f"unknown dtype {name!r}: expected a torch dtype name such as 'float32'")
    return dtype


def device_name(device: str | torch.device) -> str:
    """'<type>: <model>, ..., torch <version>', the machine key of measurements: rows under another key (another CPU,
    thread count, GPU or torch build) are never read as this machine's. The CPU thread count changes latencies too."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as f:  # not Linux: the platform's word
        model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    threads = torch.get_num_threads()
    return f"{device.type}: {model}, {threads} thread{'s' if threads > 1 else ''}, torch {torch.__version__}"


def machine_busy() -> str | None:
    """Why a kernel timed now would not show this machine's speed, or None: other processes hold its cores (a 1-minute
    load average above the core count), and a multithreaded kernel then times the scheduler at each of its barriers."""
    with contextlib.suppress(AttributeError, OSError):  # no load average on this platform: nothing to tell
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
        return f"load average {load:.1f} on {cores} cores" if load > cores else None
    return None


class Timing(NamedTuple):
    median_s: float
    spread_s: float  # interquartile range
    runs: int


def time_kernel(fn: Callable, args: Sequence, device: str | torch.device, *, repeats: int = 15,
                warmup: int = 3, min_sample_s: float = 1e-3) -> Timing:
    """Seconds per call of fn(*args): median and interquartile range over `repeats` samples, each of enough calls to
    last `min_sample_s` (the clock and Python's overhead must not dominate), ending on CUDA with a synchronize."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    def sample(number: int) -> float:
        start = time.perf_counter()
        for _ in range(number):
            fn(*args)
        sync()
        return time.perf_counter() - start
    with torch.inference_mode():
        for _ in range(warmup):
            fn(*args)
        sync()
        number, elapsed = 1, sample(1)
        while elapsed < min_sample_s:
            number = min(number * 10, max(2 * number, math.ceil(number * 1.2 * min_sample_s / max(elapsed, 1e-9))))
            elapsed = sample(number)
        times = [sample(number) / number for _ in range(repeats)]
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return Timing(float(median), float(q3 - q1), repeats)


def time_side_by_side(fns: Sequence[Callable], args: Sequence, device: str | torch.device,
                      budget_s: float, rounds: int = 61) -> list[float] | None:
    """Median seconds per call of each of ``fns`` on ``args``, interleaved (order rotating) so load and drift fall on
    all alike; rounds while ``budget_s`` lasts (at most ``rounds``), None under three (noise). On CUDA: device time.
    In the caller's grad mode: inference mode hid what a view and a version cost (DeepseekV3 at 1.03x was 0.94x)."""
    cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(2):  # warm caches and lazy initialization, then time one round
        start = time.perf_counter()
        for fn in fns:
            fn(*args)
        sync()
    per_round = time.perf_counter() - start
    if 4 * per_round > budget_s:
        return None
    for r in range(min(rounds, int(budget_s / per_round) - 1)):
        order = [(r + k) % len(fns) for k in range(len(fns))]
        if cuda:
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in fns]
            for i in order:
                events[i][0].record()
                fns[i](*args)
                events[i][1].record()
            sync()
            for i, (begin, end) in enumerate(events):
                times[i].append(begin.elapsed_time(end) / 1e3)
            continue
        for i in order:
            t = time.perf_counter()
            fns[i](*args)
            times[i].append(time.perf_counter() - t)
    return [float(np.median(t)) for t in times]


def fastest(impl: Callable, args: Sequence, device: torch.device, budget_s: float = math.inf) -> dict | None:
    """The configuration ``impl`` (a Triton wrapper) runs fastest in on ``args``: the default, then each other that runs
    while ``budget_s`` lasts (it compiles), side by side in the rest (at most 0.2 s; interpreted: 4096 elements)."""
    configs = getattr(impl, "configs", None) or [None]
    if configs[0] is None or device.type != "cuda" and sum(t.numel() for t in args if hasattr(t, "numel")) > 4096:
        return configs[0]
    runs, deadline = [], math.inf
    for i, config in enumerate(configs):
        deadline = time.perf_counter() + budget_s if i == 1 else deadline  # from the default's run: it runs anyway
        if time.perf_counter() >= deadline:
            break  # the budget is spent: the best so far
        with contextlib.suppress(Exception):  # noqa: BLE001 - one beyond this device's resources (shared memory)
            impl(*args, config=config)
            runs.append(functools.partial(impl, config=config))
    left = min(deadline - time.perf_counter(), 0.2)
    seconds = time_side_by_side(runs, args, device, left) if len(runs) > 1 and left > 0 else None
    return runs[int(np.argmin(seconds))].keywords["config"] if seconds else configs[0]


class Case(NamedTuple):
    """One kernel call to profile: an op at input shapes, attributes and dtype; ``attrs["layout"]``: operand layouts."""
    op: str
    dtype: str
    shapes: Shapes
    attrs: Mapping[str, object]


def _progress(items: list, desc: str) -> Iterable:
    """tqdm if installed (the onnx extra), else a line per item on stderr."""
    try:
        from tqdm import tqdm
    except ImportError:
        for i, item in enumerate(items, 1):
            print(f"{desc}: {i}/{len(items)} {item.op} {item.dtype} {list(item.shapes)}", file=sys.stderr)
            yield item
    else:
        yield from tqdm(items, desc=desc, unit="kernel")


def profile_shapes(cases: Iterable[Case], device: str | torch.device, db: ProfileDB, *, repeats: int = 15,
                   progress: bool = True, kernel=None, kernels: dict = {}, budget_s: float = math.inf) -> list[Record]:
    """Time and record each case: the op's torch implementation, or ``kernel`` (a registry kernel: its own rows, inputs
    moved into its memory first, tuned within ``budget_s``). Only ops of SPECS: the latency model reads no other."""
    cases = list(cases)
    if unknown := sorted({c.op for c in cases if c.op not in (SPECS if kernel is None else PRICED)}):
        raise ValueError(f"cannot profile {unknown}: no cost spec; costed ops: {', '.join(sorted(SPECS))}")
    for name in {c.dtype for c in cases}:
        torch_dtype(name)  # a typo fails now, not after an hour of profiling
    device, where, records = torch.device(device), device_name(device), []
    for case in _progress(cases, f"profiling on {where}") if progress else cases:
        tensors = PRICED[case.op].inputs(case.shapes, torch_dtype(case.dtype), device)
        layouts = case.attrs.get("layout") or [None] * len(tensors)  # as the kernel will see them
        tensors = [with_layout(t, key) for t, key in zip(tensors, layouts)]
        attrs = [case.attrs[name] for name in attr_names(case.op)]
        impl, backend = (kernels.get(case.op, OPS[case.op].impl), "torch") if kernel is None else \
            (kernel.impl, kernel.db_backend)
        tensors = [kernel.takes(t) for t in tensors] if kernel is not None and kernel.takes is not None else tensors
        config = fastest(impl, [*tensors, *attrs], device, budget_s)  # a Triton kernel's: recorded, for plans to run
        timing = time_kernel(functools.partial(impl, config=config) if config else impl, [*tensors, *attrs],
                             device, repeats=repeats)
        records.append(Record(kernel=case.op, backend=backend, device=where, dtype=case.dtype,
                              shapes=case.shapes, attrs=dict(case.attrs), runs=timing.runs,
                              median_s=timing.median_s, spread_s=timing.spread_s, config=config))
        db.add(records[-1])
    return records


def grid(ops: Iterable[str], dtypes: Iterable[str], sizes: Iterable[int]) -> list[Case]:
    """The profiling grid: every op of `ops` at the example shapes of every size, in every dtype."""
    ops, dtypes, sizes = list(ops), list(dtypes), list(sizes)
    if unknown := [op for op in ops if op not in SPECS]:
        raise ValueError(f"no profiling grid for {unknown}; profilable ops: {', '.join(sorted(SPECS))}")
    if bad := [n for n in sizes if not isinstance(n, int) or n < 1]:
        raise ValueError(f"sizes must be positive ints, got {bad}")
    return [Case(op, dtype, SPECS[op].shapes(n), {a: EXAMPLE_ATTRS[a] for a in attr_names(op)})
            for op in ops for dtype in dtypes for n in sizes]


def profile_ops(ops: Iterable[str], dtypes: Iterable[str], device: str | torch.device, db: ProfileDB,
                sizes: Iterable[int], repeats: int = 15, progress: bool = True, kernels: dict = {}) -> list[Record]:
    """Profile the grid of `ops` x `dtypes` x `sizes` on `device` into `db` (the CLI's entry)."""
    return profile_shapes(grid(ops, dtypes, sizes), device, db, repeats=repeats, progress=progress, kernels=kernels)
