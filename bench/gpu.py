"""GPU figures in one command: every Triton kernel against torch's own, and the decorator end to
end against eager and torch.compile.

Sections (``--only`` picks some):
- ``kernels``: each Triton kernel of the registry against the op's torch kernel at the sizes of
  ``measurements/gpu-h200.md``, in float16, bfloat16 and float32: error against float64
  (max |out - ref| / max |ref|) and speed (torch time / Triton time).
- ``programs``: naive attention (plain and causal), softmax, layer norm, cross entropy and a GPT-2
  block spelled ``x @ W + b``, decorated: eager, optimized and torch.compile times, host syncs per
  call, the kernels bound, the error of each against float64, the first call's seconds and any
  fallback's reason.
- ``hf``: a Hugging Face GPT-2 (C=768, 12 layers, random weights) called as users call it,
  ``model(ids)``, and as ``model(ids, use_cache=False, return_dict=False)``.
- ``suite``: bench/spellings.py's programs on the device in float32 and float16 (as many as fit in
  the run's ``--seconds``): fell back, fused, speed against eager, error.

Times are medians of calls interleaved round by round (each round calls every variant), read with
CUDA events on a GPU (device time, synchronized once per round) and with the clock on CPU. Each
program and model runs in a child process with a time limit, so one that hangs costs its limit,
not the run. ``--interpret`` runs everything at tiny sizes on CPU under ``TRITON_INTERPRET=1``
and ``EGRAPH_OPT_TRITON_ON_CPU=1`` (what a test runs; its timings mean nothing).

    python bench/gpu.py [--interpret] [--only kernels programs hf suite] [--seconds S] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

if "--interpret" in sys.argv:  # before triton is imported anywhere
    os.environ.update(TRITON_INTERPRET="1", EGRAPH_OPT_TRITON_ON_CPU="1")

import traceback  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

aten = torch.ops.aten

HERE = os.path.dirname(os.path.abspath(__file__))
#: children take turns on the device for what they time (their optimizing overlaps): a file lock
LOCK = os.environ.setdefault("EGRAPH_OPT_BENCH_LOCK", os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"egraph-opt-bench-{os.getpid()}.lock"))


class measuring:
    """Holds the device for one child's timing: no other child's kernels run meanwhile."""

    def __enter__(self):
        import fcntl

        self.file = open(LOCK, "a")
        fcntl.flock(self.file, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        self.file.close()  # releases the lock
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


# ---- timing and counting ------------------------------------------------------------------------

def interleaved(fns: list, args: tuple, rounds: int, device: str) -> list[float]:
    """Median seconds per call of each of ``fns``, calls interleaved round by round (the
    decorator's own never-slower timing: CUDA events on a GPU, so the figures are device time)."""
    from egraph_opt.profiling.profiler import time_side_by_side

    medians = time_side_by_side(fns, args, device, budget_s=600, rounds=rounds)
    if medians is None:
        raise RuntimeError("one round of calls takes over 150 s")
    return medians


class HostReads(TorchDispatchMode):
    """Counts the reads of tensor values into Python while it is active (each a synchronization
    on CUDA), and where they were asked for (file:line)."""
    OPS = {aten._local_scalar_dense, aten.is_nonzero, aten.item, aten.equal, aten.nonzero, aten.masked_select}

    def __init__(self):
        super().__init__()
        self.reads, self.where = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in self.OPS:
            self.reads.append(str(func))
            frame = next(f for f in reversed(traceback.extract_stack()[:-1]) if "torch" not in f.filename)
            self.where.append(f"{os.path.basename(frame.filename)}:{frame.lineno}")
        return func(*args, **(kwargs or {}))


def host_syncs(fn, args: tuple, device: str) -> tuple[int, list[str]]:
    """How often one call of ``fn`` waits for the device, and where (file:line of the Python
    frame that asked): CUDA's sync debug mode flags every synchronizing call on a GPU; on CPU,
    the reads of a tensor's value into Python are counted."""
    with torch.inference_mode():
        fn(*args)  # a call before: what a first call does once is not counted
    if device == "cuda":
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with torch.inference_mode():
                    fn(*args)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        where = [f"{os.path.basename(w.filename)}:{w.lineno}" for w in seen if "synchroniz" in str(w.message)]
        return len(where), sorted(set(where))
    with torch.inference_mode(), HostReads() as reads:
        fn(*args)
    return len(reads.reads), sorted(set(reads.where))


def error(out, ref) -> float:
    """max |out - ref| / max |ref| over the finite reference values (inf where out is not finite
    where ref is)."""
    out, ref = out.double().cpu(), ref.double().cpu()
    finite = ref.isfinite()
    if not out[finite].isfinite().all():
        return math.inf
    scale = ref[finite].abs().max().item() if finite.any() else 0.0
    return ((out - ref)[finite].abs().max().item() / scale) if scale else 0.0


def float64(fn, args: tuple):
    """``fn`` evaluated in float64 (a module on a float64 copy), on the same device."""
    wide = tuple(a.double() if a.is_floating_point() else a for a in args)
    if isinstance(fn, nn.Module):
        import copy
        fn = copy.deepcopy(fn).double()
    with torch.inference_mode():
        return fn(*wide)


# ---- kernels ------------------------------------------------------------------------------------

def kernel_cases(tiny: bool):
    """(label, op, shapes as made, attributes, make(dtype, device) -> operands)."""
    def rand(*shape):
        return lambda dtype, device: (torch.randn(shape, device=device) * 3).to(dtype)
    rows = [(8, 64), (4, 1500)] if tiny else [(4096, 1024), (4096, 8192), (1024, 50304)]
    for op in ("softmax", "log_softmax"):
        for shape in rows:
            yield op, op, shape, (-1,), lambda dtype, device, s=shape: (rand(*s)(dtype, device),)
    shape = rows[-1] if tiny else (4096, 8192)
    yield "logsumexp", "logsumexp", shape, (-1, False), lambda dtype, device: (rand(*shape)(dtype, device),)
    for n, c in ([(8, 48)] if tiny else [(16384, 1024), (8192, 4096)]):
        yield ("layer_norm", "layer_norm", (n, c), (1e-5,), lambda dtype, device, n=n, c=c: (
            rand(n, c)(dtype, device), (1 + 0.1 * torch.randn(c, device=device)).to(dtype),
            (0.1 * torch.randn(c, device=device)).to(dtype)))
    attention = [((1, 2, 32, 16), False), ((1, 2, 32, 16), True)] if tiny else [
        ((8, 16, 1024, 64), False), ((8, 16, 1024, 64), True), ((4, 16, 4096, 128), True),
        ((16, 12, 512, 64), False)]
    for shape, causal in attention:
        yield ("sdpa causal" if causal else "sdpa", "sdpa", shape, (shape[-1] ** -0.5, causal),
               lambda dtype, device, s=shape: tuple((torch.randn(s, device=device)).to(dtype) for _ in range(3)))
    gemms = [(16, 32, 48)] if tiny else [(8192, 1024, 4096), (8192, 4096, 1024)]
    for m, k, n in gemms:
        for act in ("relu", "gelu_tanh"):
            yield (f"linear_act ({act})", "linear_act", (m, k, n), (act,), lambda dtype, device, m=m, k=k, n=n: (
                torch.randn(m, k, device=device).to(dtype), (torch.randn(n, k, device=device) / k ** 0.5).to(dtype),
                (0.1 * torch.randn(n, device=device)).to(dtype)))
    n, v = (16, 100) if tiny else (8192, 50304)
    yield ("cross_entropy", "cross_entropy", (n, v), ("mean", -100), lambda dtype, device: (
        rand(n, v)(dtype, device), torch.randint(0, v, (n,), device=device)))


def kernels(device: str, tiny: bool, deadline: float = math.inf) -> list[dict]:
    from egraph_opt.kernels.registry import REGISTRY
    from egraph_opt.lang.ops import OPS

    torch.manual_seed(0)
    rows = []
    for label, op, shape, attrs, make in kernel_cases(tiny):
        if time.monotonic() > deadline:
            rows.append({"op": label, "shape": list(shape), "skipped": "no time left"})
            continue
        triton_kernel = REGISTRY.get(f"triton.{op}")
        if triton_kernel is None:
            rows.append({"op": label, "shape": list(shape), "skipped": "no Triton kernel"})
            continue
        for name, dtype in DTYPES.items():
            args = make(dtype, device)
            ref = OPS[op].impl(*(a.double() if a.is_floating_point() else a for a in args), *attrs)
            row = {"op": label, "shape": list(shape), "dtype": name}
            try:
                out = triton_kernel.impl(*args, *attrs)
                with measuring():
                    ours, theirs = interleaved([lambda *a: triton_kernel.impl(*a, *attrs),
                                                lambda *a: REGISTRY[f"torch.{op}"].impl(*a, *attrs)], args,
                                               3 if tiny else 25, device)
            except Exception as e:  # noqa: BLE001 - a kernel that fails is a row that says so
                row["failed"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
                rows.append(row)
                print(json.dumps(row), flush=True)
                continue
            row.update(error=error(out, ref), triton_ms=ours * 1e3, torch_ms=theirs * 1e3,
                       speedup=theirs / ours)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del args, ref, out
    return rows


# ---- programs -----------------------------------------------------------------------------------

def naive_attention(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.exp(s) / torch.exp(s).sum(-1, keepdim=True) @ v


def causal_attention(q, k, v):
    t = q.shape[-2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def naive_softmax(x):
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def naive_layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def naive_cross_entropy(logits, target):
    p = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    return -torch.log(p).gather(-1, target[:, None]).mean()


class NaiveBlock(nn.Module):
    """A GPT-2 block as from-scratch code writes it: weights stored (in, out) and applied as
    ``x @ W + b``, layer norm from mean and variance, exp/sum softmax under a causal mask, tanh gelu."""

    def __init__(self, c: int, heads: int, t: int):
        super().__init__()
        self.heads = heads
        p = lambda *s, scale=0.02: nn.Parameter(scale * torch.randn(*s))  # noqa: E731
        self.w_qkv, self.b_qkv, self.w_proj, self.b_proj = p(c, 3 * c), p(3 * c), p(c, c), p(c)
        self.w_fc, self.b_fc, self.w_out, self.b_out = p(c, 4 * c), p(4 * c), p(4 * c, c), p(c)
        self.g1, self.g2 = nn.Parameter(torch.ones(c)), nn.Parameter(torch.ones(c))
        self.s1, self.s2 = nn.Parameter(torch.zeros(c)), nn.Parameter(torch.zeros(c))
        self.register_buffer("mask", torch.ones(t, t, dtype=torch.bool).triu(1))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (naive_layer_norm(x, self.g1, self.s1) @ self.w_qkv + self.b_qkv).split(c, -1)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        s = (q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)).masked_fill(self.mask, float("-inf"))
        w = torch.exp(s - s.max(-1, keepdim=True).values)
        y = (w / w.sum(-1, keepdim=True) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + y @ self.w_proj + self.b_proj
        g = naive_layer_norm(x, self.g2, self.s2) @ self.w_fc + self.b_fc
        g = 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3)))
        return x + g @ self.w_out + self.b_out


def programs(tiny: bool) -> dict:
    """name -> make(device, dtype) -> (fn, args): the naive programs at the sizes of
    ``measurements/gpu-h200.md`` (tiny: a few elements, for the interpreter)."""
    b, h, t, d = (1, 2, 16, 16) if tiny else (8, 16, 1024, 64)
    rows, cols = (4, 32) if tiny else (4096, 8192)
    n, v = (8, 40) if tiny else (8192, 50304)
    c, heads, bt, bb = (32, 2, 8, 1) if tiny else (768, 12, 1024, 8)

    def qkv(fn):  # q, k and v distinct tensors
        return lambda device, dtype: (fn, tuple(torch.randn(b, h, t, d, device=device, dtype=dtype)
                                                for _ in range(3)))

    def block(device, dtype):
        torch.manual_seed(0)
        return NaiveBlock(c, heads, bt).to(device, dtype).eval(), (torch.randn(bb, bt, c, device=device, dtype=dtype),)

    return {
        "naive_attention": qkv(naive_attention), "causal_attention": qkv(causal_attention),
        "naive_softmax": lambda device, dtype: (naive_softmax, ((torch.randn(rows, cols, device=device) * 3).to(dtype),)),
        "naive_layer_norm": lambda device, dtype: (naive_layer_norm, tuple(x.to(dtype) for x in (
            torch.randn(rows, cols, device=device), 1 + 0.1 * torch.randn(cols, device=device),
            0.1 * torch.randn(cols, device=device)))),
        "naive_cross_entropy": lambda device, dtype: (naive_cross_entropy, (
            (torch.randn(n, v, device=device) * 2).to(dtype), torch.randint(0, v, (n,), device=device))),
        "gpt2_block": block,
    }


#: (program, dtype, timed against torch.compile too): the decorator's table
TABLE = [("naive_attention", "float16", True), ("naive_attention", "bfloat16", False),
         ("naive_attention", "float32", False), ("causal_attention", "float16", True),
         ("naive_softmax", "float16", True), ("naive_layer_norm", "float16", True),
         ("naive_cross_entropy", "float16", True), ("naive_cross_entropy", "float32", False),
         ("gpt2_block", "float16", True), ("gpt2_block", "float32", True)]
ROWS = [f"{name} {dtype}" for name, dtype, _ in TABLE]


def run_program(name: str, device: str, tiny: bool, use_compile: bool) -> dict:
    from egraph_opt import saturate_and_extract

    program, dtype = name.split()
    compiles = dict(((p, d), c) for p, d, c in TABLE)[program, dtype]
    fn, args = programs(tiny)[program](device, DTYPES[dtype])
    row = {"program": name, "shape": list(args[0].shape)}
    ref = float64(fn, args)
    with torch.inference_mode():
        eager_out = fn(*args)
    optimized = saturate_and_extract(fn)
    start = time.perf_counter()
    with torch.inference_mode():
        out = optimized(*args)
    if device == "cuda":
        torch.cuda.synchronize()
    row["first_call_s"] = time.perf_counter() - start
    report = optimized.report
    row["fallback"] = report.fallback
    row["kernels"] = dict(sorted(report.kernels.items())) if report.kernels else {}
    row["measured"] = list(report.measured) if report.measured else None
    row["error"], row["eager_error"] = error(out, ref), error(eager_out, ref)
    (row["syncs"], row["synced_at"]), (row["eager_syncs"], _) = \
        host_syncs(optimized, args, device), host_syncs(fn, args, device)
    variants = [fn, optimized]
    if use_compile and compiles and not tiny:
        compiled = torch.compile(fn)
        start = time.perf_counter()
        with torch.inference_mode():
            compiled(*args)
        torch.cuda.synchronize()
        row["compile_first_call_s"] = time.perf_counter() - start
        variants.append(compiled)
    with measuring():
        times = interleaved(variants, args, 5 if tiny else 30, device)
    row["eager_ms"], row["optimized_ms"] = times[0] * 1e3, times[1] * 1e3
    row["compile_ms"] = times[2] * 1e3 if len(times) > 2 else None
    return row


# ---- Hugging Face GPT-2 -------------------------------------------------------------------------

def run_hf(device: str, tiny: bool, use_compile: bool) -> list[dict]:
    import transformers as tf

    from egraph_opt import saturate_and_extract

    tf.logging.set_verbosity_error()
    c, layers, heads, b, t = (64, 2, 4, 1, 16) if tiny else (768, 12, 12, 8, 512)
    dtype = torch.float32 if tiny else torch.float16
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=c, n_layer=layers, n_head=heads,
                                             n_positions=max(t, 64))).to(device, dtype).eval()
    ids = torch.randint(0, model.config.vocab_size, (b, t), device=device)
    rows = []
    for label, call in (("model(ids)", lambda m: m),
                        ("model(ids, use_cache=False, return_dict=False)",
                         lambda m: lambda x: m(x, use_cache=False, return_dict=False)[0])):
        row = {"program": f"HF GPT-2 {label}", "shape": [b, t], "layers": layers, "width": c}
        optimized = saturate_and_extract(model)
        fn_opt, fn_eager = call(optimized), call(model)
        start = time.perf_counter()
        with torch.inference_mode():
            fn_opt(ids)
        if device == "cuda":
            torch.cuda.synchronize()
        row["first_call_s"] = time.perf_counter() - start
        report = optimized.report
        row["fallback"] = report.fallback if report else "never optimized"
        row["kernels"] = dict(sorted(report.kernels.items())) if report and report.kernels else {}
        (row["syncs"], row["synced_at"]), (row["eager_syncs"], _) = \
            host_syncs(fn_opt, (ids,), device), host_syncs(fn_eager, (ids,), device)
        variants = [fn_eager, fn_opt]
        if use_compile and not tiny and label.startswith("model(ids,"):
            compiled = torch.compile(model)
            start = time.perf_counter()
            with torch.inference_mode():
                call(compiled)(ids)
            torch.cuda.synchronize()
            row["compile_first_call_s"] = time.perf_counter() - start
            variants.append(call(compiled))
        with measuring():
            times = interleaved(variants, (ids,), 3 if tiny else 10, device)
        row["eager_ms"], row["optimized_ms"] = times[0] * 1e3, times[1] * 1e3
        row["compile_ms"] = times[2] * 1e3 if len(times) > 2 else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# ---- the spelling suite -------------------------------------------------------------------------

def run_suite(device: str, tiny: bool, seconds: float) -> list[dict]:
    sys.path.insert(0, HERE)
    from spellings import SUITE

    from egraph_opt import saturate_and_extract

    deadline, rows = time.monotonic() + seconds, []
    t = 16 if tiny else 1024
    for name, spelling in SUITE.items():
        for dtype in (torch.float32, torch.float16):
            if time.monotonic() > deadline:
                return rows
            fn, args = spelling.make(t)
            if isinstance(fn, nn.Module):
                fn = fn.to(device, dtype)
            args = tuple(a.to(device, dtype) if a.is_floating_point() else a.to(device) for a in args)
            row = {"spelling": name, "dtype": str(dtype).removeprefix("torch.")}
            try:
                ref = float64(fn, args)
                with torch.inference_mode():
                    eager_out = fn(*args)
                optimized = saturate_and_extract(fn)
                with torch.inference_mode():
                    out = optimized(*args)
            except Exception as e:  # noqa: BLE001 - eager itself raises (a float32 mask in half)
                row["failed"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:120]
                rows.append(row)
                continue
            report = optimized.report
            first = lambda x: x[0] if isinstance(x, tuple) else x  # noqa: E731 - rotary returns (q, k)
            row.update(fallback=report.fallback, fused=any(op in report.ops_after for op in spelling.fuses),
                       error=error(first(out), first(ref)), eager_error=error(first(eager_out), first(ref)),
                       kernels=dict(sorted(report.kernels.items())) if report.kernels else {})
            with measuring():
                eager, ours = interleaved([fn, optimized], args, 3 if tiny else 20, device)
            row["speed"] = eager / ours
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# ---- the driver ---------------------------------------------------------------------------------

def child(what: str, args: argparse.Namespace, limit: float) -> list[dict]:
    """Runs one section part (``programs:NAME``, ``hf``, ``suite``) in a child process within
    ``limit`` seconds; its JSON rows, and one row saying why where it failed or ran out of time."""
    command = [sys.executable, os.path.abspath(__file__), "--child", what,
               "--suite-seconds", str(max(limit - 60, 10))] + \
        (["--interpret"] if args.interpret else []) + (["--no-compile"] if args.no_compile else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=max(limit, 1))
        output, failed = done.stdout, (done.stderr.strip().splitlines() or [""])[-1] if done.returncode else None
    except subprocess.TimeoutExpired as e:
        output = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        failed = f"did not finish in {limit:.0f} s"
    rows = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    if failed:
        rows.append({"program": what, "failed": failed[:200]})
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def markdown(results: dict, device_name: str) -> str:
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.3f}"
        if isinstance(v, dict):
            return ", ".join(f"{k} x{n}" for k, n in v.items())
        return str(v).replace("|", "/")

    lines = [f"# bench/gpu.py on {device_name}", "",
             f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}", ""]
    for section, rows in results.items():
        if not rows:
            continue
        keys = list(dict.fromkeys(k for r in rows for k in r))
        lines += [f"## {section}", "", "| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
        lines += ["| " + " | ".join(cell(r.get(k)) for k in keys) + " |" for r in rows]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--interpret", action="store_true", help="tiny sizes on CPU, Triton interpreted")
    p.add_argument("--only", nargs="+", choices=("kernels", "programs", "hf", "suite"),
                   default=("kernels", "programs", "hf", "suite"))
    p.add_argument("--programs", nargs="+", help="with programs: only these (names as listed)")
    p.add_argument("--no-compile", action="store_true", help="no torch.compile columns")
    p.add_argument("--seconds", type=float, default=420, help="the whole run's limit")
    p.add_argument("--program-seconds", type=float, default=150, help="limit of each program's child")
    p.add_argument("--jobs", type=int, help="children at once (their timing takes turns); "
                   "default 4 on a GPU, 1 interpreted")
    p.add_argument("--out", help="write the tables as markdown here (after every section)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--suite-seconds", type=float, default=120, help=argparse.SUPPRESS)
    args = p.parse_args()
    device = "cpu" if args.interpret else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/gpu.py: no CUDA device here; run it with --interpret on CPU")
    use_compile = not args.no_compile
    if args.child:  # one part, in its own process: rows as JSON lines on stdout
        what, _, name = args.child.partition(":")
        if what == "programs":
            print(json.dumps(run_program(name, device, args.interpret, use_compile)), flush=True)
        elif what == "hf":
            run_hf(device, args.interpret, use_compile)
        elif what == "kernels":
            kernels(device, args.interpret, time.monotonic() + args.suite_seconds)
        else:
            run_suite(device, args.interpret, args.suite_seconds)
        return
    from concurrent.futures import ThreadPoolExecutor

    deadline = time.monotonic() + args.seconds
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreted)"
    sections = {"programs": "The decorator end to end", "kernels": "Triton kernels against torch's",
                "hf": "Hugging Face GPT-2", "suite": "The spelling suite"}
    results = {sections[k]: [] for k in sections if k in args.only}

    def write():
        if args.out:
            with open(args.out, "w") as f:
                f.write(markdown(results, name))

    def part(what: str) -> tuple[str, list[dict]]:
        left = deadline - time.monotonic() - 5
        limit = min(left, args.program_seconds) if what.startswith("programs") else left
        rows = child(what, args, limit) if left > 10 else [{"program": what, "failed": "no time left"}]
        return sections[what.partition(":")[0]], rows

    chosen = args.programs or ROWS
    unknown = sorted(set(chosen) - set(ROWS))
    if unknown:
        sys.exit(f"bench/gpu.py: no program {unknown[0]!r}; programs: {', '.join(ROWS)}")
    parts = [f"programs:{p}" for p in chosen] if "programs" in args.only else []
    parts = (["hf"] if "hf" in args.only else []) + parts + \
        [k for k in ("kernels", "suite") if k in args.only]
    with ThreadPoolExecutor(args.jobs or (1 if args.interpret else 4)) as pool:
        for section, rows in pool.map(part, parts):
            results[section] += rows
            write()
    print(markdown(results, name))


if __name__ == "__main__":
    main()
