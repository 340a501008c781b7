"""The GPU path without a GPU: under the test switch EGRAPH_OPT_TRITON_ON_CPU=1 (and
TRITON_INTERPRET=1, set by conftest) Triton kernels take CPU tensors and bind wherever one accepts
a node, so the whole pipeline (binding, the plan module, validation, the report) runs through
them; and with the device path forced (``ops.forcing_device_path``) a plan's run reads no value
on the host, as it must not on CUDA, where each read stalls the stream."""
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from egraph_opt import saturate_and_extract
from egraph_opt.kernels import torch_ops as ops
from egraph_opt.lang.ops import OPS

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from gpu import HostReads, programs  # noqa: E402 - the programs bench/gpu.py times on a GPU

PROGRAMS = list(programs(tiny=True))
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def run_plan(name, dtype):
    """The decorated program called twice: optimized on the first call, its plan run on the second
    with the device path forced; the second call's output and host reads, and the report."""
    fn, args = programs(tiny=True)[name]("cpu", dtype)
    f = saturate_and_extract(fn)
    with torch.no_grad():
        f(*args)
        with ops.forcing_device_path(), HostReads() as reads:
            out = f(*args)
        expected = fn(*args)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
    return reads.reads, str(f.report)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", PROGRAMS)
def test_programs_run_through_triton_kernels_and_read_nothing_on_the_host(name, dtype, monkeypatch):
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")
    reads, report = run_plan(name, dtype)
    kernels = next(line for line in report.splitlines() if line.startswith("[KERNELS]"))
    assert "triton." in kernels, report
    assert "[VALIDATION] passed" in report, report
    assert reads == []


@pytest.mark.parametrize("name", PROGRAMS)
def test_torch_kernels_guard_on_the_device_path_without_reading_on_the_host(name):
    """Without the switch the fused ops run torch's kernels, whose guards (score bounds, rows of
    a layer norm to redo, a NaN loss) stay on the device path too."""
    reads, report = run_plan(name, torch.float32)
    assert "triton." not in report and "[VALIDATION] passed" in report, report
    assert reads == []


def test_the_switch_needs_the_interpreter(monkeypatch):
    from egraph_opt.kernels import triton as K
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")
    assert K.available("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not K.available("cpu")


def _extremes():
    """Each guarded op at the inputs its guards are for: overflowing scores in one head, NaN and
    +-inf operands, rows every key masks, a variance past float32, a NaN loss, an infinite weight."""
    r = torch.randn
    q, k, v = r(2, 2, 5, 4), r(2, 2, 6, 4), r(2, 2, 6, 4)
    big = q.clone()
    big[1, 0] *= 1e20  # one head's scores overflow
    holed = q.clone()
    holed[0, 1, 2, 0] = math.nan
    keep = torch.ones(5, 6, dtype=torch.bool).tril()
    keep[3] = False
    bias = torch.zeros(5, 6).masked_fill(~keep, -math.inf)
    inf_bias = bias.clone()
    inf_bias[1, 1] = math.inf
    nan_v = v.clone()
    nan_v[0, 0, 1, 1] = math.nan
    wide = r(3, 8)
    wide[1] *= 1e30
    logits = r(4, 5)
    logits[1, 2], logits[2, 0] = math.inf, math.nan
    weight = r(3, 2, 3, 3)
    weight[0, 0, 0, 0] = math.inf
    posinf = r(3, 7)
    posinf[0, 3] = math.inf
    return [("sdpa", ops.sdpa, (t, k, v, 0.5, causal))
            for t in (q, big, holed) for causal in (False, True)] + [
        ("sdpa_masked", ops.sdpa_masked, (t, k, v, bias, 0.5)) for t in (q, big)] + [
        ("sdpa_filled", ops.sdpa_filled, (t, k, v, keep, 0.5, fill))
        for t in (q, big) for fill in (-3.4e38, -1e9, -1.0, -math.inf)] + [
        ("sdpa_guarded", ops.sdpa_guarded, (q, k, vv, b, 0.5))
        for vv in (v, nan_v) for b in (bias, inf_bias)] + [
        ("sdpa_floored", ops.sdpa_floored, (t, k, v, b, 0.5, floor))  # scores past floor's ulp: the definition
        for t in (q, big, holed) for b in (bias, inf_bias) for floor in (-3.4028234663852886e38, -1e9, -1.0)] + [
        ("layer_norm", ops.layer_norm, (wide, r(8), r(8), 1e-5)),
        ("gelu", ops.gelu, (torch.tensor([math.inf, -math.inf, 3e38, -0.0, 9.0]), "none")),
        *[("cross_entropy", ops.cross_entropy, (logits, torch.tensor([2, 1, 0, 4]), reduction, ignore))
          for reduction, ignore in (("mean", -100), ("none", 1), ("sum", 0))],
        ("conv2d", ops.conv2d, (r(1, 2, 5, 5), weight, r(3), "1,1", "1,1", "1,1", 1)),
        ("softmax", ops.softmax, (posinf, -1)), ("log_softmax", ops.log_softmax, (posinf, -1))]


@pytest.mark.parametrize("case", range(len(_extremes())))
def test_the_device_path_computes_what_the_host_path_does_at_the_extremes(case):
    """Guards selected on the device give the host path's values, NaN for NaN, and read nothing."""
    name, op, args = _extremes()[case]
    host = op(*args)
    with ops.forcing_device_path(), HostReads() as reads:
        device = op(*args)
    assert reads.reads == [], name
    torch.testing.assert_close(device, host, rtol=1e-5, atol=1e-6, equal_nan=True, msg=name)


def test_explore_and_profiling_rows_take_the_triton_path(monkeypatch, tmp_path):
    """explore() reads a plan bound to Triton kernels, and the profiler times a Triton kernel on
    CPU tensors into rows of its own (interpreted: the timing means nothing, the path runs)."""
    from egraph_opt import explore
    from egraph_opt.kernels.registry import REGISTRY
    from egraph_opt.profiling.profile_db import ProfileDB
    from egraph_opt.profiling.profiler import Case, device_name, profile_shapes
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")
    fn, args = programs(tiny=True)["naive_softmax"]("cpu", torch.float32)
    f = saturate_and_extract(fn)
    f(*args)
    assert "triton.softmax" in str(f.report) and explore(f).fallback == ""
    weighed = {row[2]: row for row in explore(f).kernels().rows if row[1] == "softmax"}
    assert {"triton.softmax", "torch.softmax"} <= set(weighed)  # each path with its latency
    assert weighed["triton.softmax"][5] == "*" and all(row[3] > 0 for row in weighed.values())
    with ProfileDB(tmp_path / "p.sqlite") as db:
        kernel = REGISTRY["triton.softmax"]
        profile_shapes([Case("softmax", "float16", ((4, 16),), {"axis": -1})], "cpu", db,
                       repeats=1, progress=False, kernel=kernel)
        assert db.records("softmax", kernel.db_backend, device_name("cpu"), "float16")



def _extreme_grid(dtype):
    """Every pair of extreme values (+-inf, NaN, +-0, subnormals, +-dtype max, ordinary ones) as
    the rows and columns of two inputs, and the same shifted as two more. Not bfloat16's
    subnormals: the interpreter converts bfloat16 by truncating its bits, flushing them to zero
    (and rounding toward zero: one ulp, which the test allows), where a GPU converts exactly."""
    info = torch.finfo(dtype)
    tiny = [info.smallest_normal / 4, -info.smallest_normal / 2] if dtype != torch.bfloat16 else []
    values = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, *tiny, info.max, -info.max,
                           1.5, -0.75], dtype=dtype)
    n = len(values)
    rows, cols = values.repeat_interleave(n).reshape(n, n), values.repeat(n).reshape(n, n)
    return rows, cols, cols.roll(3, 0), rows.roll(5, 1)


def _region(x, a, b, r):
    """An elementwise chain: one generated kernel."""
    return torch.tanh(x * a + b) * 0.5 + r


def _split(x, a, b, r):
    """atan2 has no template: the chains below and above it are two generated kernels."""
    return torch.exp(torch.atan2(x * a + b, r) * 2.0 - r)


def _loss(x, a, b, r):
    """A chain feeding a mean over the last axis: one generated kernel, a row each."""
    return (torch.tanh(x * a + b) - r).abs().mean(-1)


def _shared(x, a, b, r):
    """x * a + b is read by two ops of one region: computed there once, one generated kernel."""
    h = x * a + b
    return torch.tanh(h) * r + h


def _shared_outside(x, a, b, r):
    """x * a + b is read by an op outside the region too (atan2 has no template): its own kernel."""
    h = x * a + b
    return torch.tanh(h) * r + torch.atan2(h, r)


def _biased(x, bias, row, s):
    """A (C,) bias, a per-row (R, 1) value and a 0-d scale broadcast into one generated kernel."""
    return torch.tanh((x - row) * s + bias) * row + x


def _broadcast(x, a, b, r):
    """x's rows hold every extreme, and so do the (float32: its add promotes) bias and the rows' values."""
    return x, a[0].float(), r[:, :1].contiguous(), torch.tensor(-0.75, dtype=x.dtype)


def _casts(x, a, b, r):
    """A half program computes in float32 between its casts: one generated kernel, rounding once at the last."""
    return (torch.tanh(x.float() * a.float() + b.float()) * r.float()).to(x.dtype)


def _variance(x, bias, row, s):
    """A square reads its operand twice, from one user: one generated kernel with the mean."""
    d = (x - row) * s
    return (d * d + bias).mean(-1)


def _gapped(x, w, b):
    """w (2, 1, C) keeps axes on both sides of a broadcast one: no (div, mod) reads it, so its
    product stays out of the region, whose tanh and add are one generated kernel."""
    return torch.tanh(x * w) + b


def _gap(x, a, b, r):
    return torch.stack([x, a]), torch.stack([b[:1], r[:1]]), torch.stack([r, x])


def _softmax(x, bias, s):
    """A scale and bias feeding a softmax over the last axis: one generated kernel, a row each."""
    return torch.softmax(x * s + bias, -1)


def _softmax_rows(x, a, b, r):
    """Row i holds the i-th extreme among finite ones (+-0, subnormals, +-max), a last row -inf only;
    a (C,) bias and a 0-d scale."""
    finite = torch.where(a[0].isfinite(), a[0], 1.5)
    rows = torch.where(torch.eye(len(finite), dtype=torch.bool), x, finite)
    return torch.cat([rows, torch.full_like(rows[:1], -math.inf)]), -finite.flip(0), torch.tensor(0.5, dtype=x.dtype)


def _normed(x, w, b, r):
    """A scale into a layer norm, its weight and bias, and a residual add after: one generated kernel."""
    return F.layer_norm(x * 0.5, x.shape[-1:], w, b) + r


def _residual(x, w, b, r):
    """A residual add read by a layer norm and by the add after it: one generated kernel."""
    h = x * 0.5 + r
    return F.layer_norm(h, h.shape[-1:], w, b) + h


def _rms(x, w, b, r):
    """A shift into an rms norm with its weight, a cast and a product after: one generated kernel."""
    return F.rms_norm(x - b, x.shape[-1:], w, eps=1e-6).float() * r.float()


def _norm_rows(x, a, b, r):
    """Row i holds the i-th extreme (+-inf, NaN, +-0, subnormals, +-max) among ordinary values; a (C,)
    weight and bias; rows of each extreme as the residual."""
    ordinary = torch.linspace(-2.0, 3.0, len(x), dtype=x.dtype)
    return torch.where(torch.eye(len(x), dtype=torch.bool), x, ordinary), ordinary.flip(0), ordinary * 0.5, r


def _piecewise(x, a, b, r):
    """A where() over a comparison: one generated kernel (a mask is 1.0 or 0.0 there); a half one compares in its own
    dtype, as torch does (a constant rounded to it): its comparison stays torch's, read as a bool."""
    return torch.where(x < a, torch.tanh(x) * r, x * 0.5 + b)


def _masked(x, m, b, r):
    """A bool mask the caller gives, selecting and multiplying: one generated kernel."""
    return torch.where(m, torch.tanh(x) * r, x * 0.5 + b) + m * b


def _mask(x, a, b, r):
    return x, x < a, b, r


def _same(*t):
    return t


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
REGIONS = [(fn, args, kernels, dtype) for dtype in DTYPES for fn, args, kernels in [
    (_region, _same, {"triton.generated": 1}),
    (_split, _same, {"torch.atan2": 1, "triton.generated": 2}),
    (_biased, _broadcast, {"triton.generated": 1}), (_masked, _mask, {"triton.generated": 1}),
    (_piecewise, _same, {"triton.generated": 1} if dtype == torch.float32 else {"torch.less": 1, "triton.generated": 1})]] + [
    (_casts, _same, {"triton.generated": 1}, dtype) for dtype in DTYPES[1:]] + [
    # in half precision the mean is rewritten to accumulate in float32: its cast back follows the root
    (_loss, _same, {"triton.generated": 1}, torch.float32),
    (_shared, _same, {"triton.generated": 1}, torch.float32),
    (_shared_outside, _same, {"torch.atan2": 1, "triton.generated": 2}, torch.float32),
    (_variance, _broadcast, {"triton.generated": 1}, torch.float32),
    (_gapped, _gap, {"torch.mul": 1, "triton.generated": 1}, torch.float32)] + [
    (_softmax, _softmax_rows, {"triton.generated": 1}, dtype) for dtype in DTYPES] + [
    (fn, _norm_rows, {"triton.generated": 1}, dtype) for fn in (_normed, _residual, _rms) for dtype in DTYPES]
#: the program of separate kernels a region replaces, where torch's eager one differs: the softmax
#: kernel it replaces (ops.softmax) gives NaN at a row's +inf and 0 beside it, where torch's is NaN
UNFUSED = {_softmax: lambda x, bias, s: OPS["softmax"].impl(x * s + bias, -1),
           _normed: lambda x, w, b, r: (ops.layer_norm((x * 0.5).float(), w.float(), b.float(), 1e-5) + r).to(x.dtype)}
UNFUSED[_residual] = lambda x, w, b, r: (lambda h: (ops.layer_norm(h.float(), w.float(), b.float(), 1e-5) + h)
                                         .to(x.dtype))(x * 0.5 + r)
#: a layer norm is not torch's algorithm (its variance is of deviations, in blocks): one ulp more
ULPS = {_normed: 2, _residual: 2}


@pytest.mark.parametrize("fn, args, kernels, dtype",
                         [pytest.param(*case, id=f"{case[0].__name__}-{case[3]}") for case in REGIONS])
def test_an_elementwise_region_is_one_generated_kernel_exact_at_the_extremes(fn, args, kernels, dtype,
                                                                             monkeypatch):
    """Under the test switch the backend binds a generated kernel for each maximal region of
    elementwise ops that codegen has templates for (and the row reduction or softmax they feed), on
    operands that broadcast and through casts; the plan validates, and at the extremes it gives the
    separate kernels' values (a region loads half, computes in float32 and rounds where each op's
    kernel rounds its output), NaN for NaN and the sign of every zero."""
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")
    args = args(*_extreme_grid(dtype))
    # static estimates: the interpreter's timings mean nothing, and rows other tests timed on a busy machine once
    # priced _split's float64 form no slower; no float64 for accuracy at the extremes (atan2's chains) either
    f = saturate_and_extract(fn, profile_db=False, profile_budget=0, max_slowdown=1.0)
    with torch.no_grad():
        f(*(torch.randn(t.shape).to(t.dtype) for t in args))
        out = f(*args)
    assert f.report.kernels == kernels and "[VALIDATION] passed" in str(f.report), f.report
    expected = UNFUSED.get(fn, fn)(*args)
    ulp = {torch.float32: 1e-5, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[dtype]
    torch.testing.assert_close(out, expected, rtol=ulp * ULPS.get(fn, 1), atol=0, equal_nan=True)
    assert torch.equal(out.signbit()[out == 0], expected.signbit()[expected == 0])


def _extreme_rows(dtype):
    """Rows holding +-0, +-dtype max, +inf, -inf and NaN beside ordinary values."""
    big, inf, nan = torch.finfo(dtype).max, math.inf, math.nan
    return torch.tensor([[0.0, -0.0, 1.0, 2.0], [big, -big, 0.0, 1.0], [inf, 0.0, 1.0, 2.0],
                         [nan, 1.0, 2.0, 3.0], [-inf, 0.0, 1.0, 2.0], [-big, -big, -0.0, 0.0]], dtype=dtype)


#: fused op -> a program computing it (on the rows, then the operands ``_operands`` gives), and
#: the op's definition (applied in float64)
FUSED = {"cross_entropy": (lambda x, t: F.cross_entropy(x, t, reduction="none"),
                           lambda x, t: OPS["cross_entropy"].impl(x, t, "none", -100)),
         "softmax": (lambda x: torch.softmax(x, -1), lambda x: OPS["softmax"].impl(x, -1)),
         "layer_norm": (lambda x, w, b: F.layer_norm(x, (4,), w, b), lambda x, w, b: F.layer_norm(x, (4,), w, b))}


def _operands(op, dtype):
    return {"cross_entropy": [torch.tensor([1, 0, 1, 2, 3, 0])], "softmax": [],
            "layer_norm": [torch.randn(4, dtype=dtype), torch.randn(4, dtype=dtype)]}[op]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", sorted(FUSED))
def test_fused_ops_bind_their_triton_kernel_and_keep_the_definition_at_the_extremes(op, dtype, monkeypatch):
    """Under the switch cross entropy, softmax and layer norm run Triton's kernels, whose values at
    +-inf, NaN, +-0 and the dtype's max are the op's definition (float64, then rounded). A half
    softmax or layer norm computes in float32 between two casts: the three are one generated kernel."""
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")
    (fn, definition), x, rest = FUSED[op], _extreme_rows(dtype), _operands(op, dtype)
    f = saturate_and_extract(fn, profile_db=False, profile_budget=0)
    with torch.no_grad():
        f(torch.randn(6, 4, dtype=dtype), *rest)
        out = f(x, *rest)
    kernel = "triton.generated" if op != "cross_entropy" and dtype != torch.float32 else f"triton.{op}"
    assert kernel in str(f.report) and "[VALIDATION] passed" in str(f.report), str(f.report)
    expected = definition(x.double(), *(r.double() if r.is_floating_point() else r for r in rest))
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), expected.to(dtype).double(), rtol=tol, atol=tol, equal_nan=True)


class _Spy:
    """A kernel noting the (BLOCK, num_warps) each launch passes in ``seen``, as the TF32 test notes precision."""

    def __init__(self, kernel, seen: list):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.append((kwargs["BLOCK"], kwargs["num_warps"]))
            return self.kernel[grid](*args, **kwargs)
        return launch


def _launches(monkeypatch, module, name):
    seen = []
    monkeypatch.setattr(module, name, _Spy(getattr(module, name), seen))
    return seen


@pytest.mark.parametrize("recorded", [True, False], ids=["row", "no row"])
def test_a_plan_launches_the_configuration_its_database_row_records(recorded, tmp_path, monkeypatch):
    """The configuration the profiler found fastest at the nearest measured shape is passed to the
    kernel when the plan is built (its calls never tune); with no row, the default (blocks of 512 for
    rows of 300, four warps) runs. Nothing is profiled here: the budget is 0."""
    import importlib
    from egraph_opt.profiling.profile_db import ProfileDB, Record
    from egraph_opt.profiling.profiler import device_name
    module = importlib.import_module("egraph_opt.kernels.triton.softmax")  # the package's name is the wrapper
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")
    config = module.softmax.configs[1]  # blocks of 256 in two warps
    with ProfileDB(tmp_path / "p.sqlite") as db:
        if recorded:
            db.add(Record(kernel="softmax", backend="triton", device=device_name("cpu"), dtype="float32",
                          shapes=((4, 310),), attrs={"axis": -1}, runs=5, median_s=1e-6, spread_s=0.0,
                          config=config))
    seen = _launches(monkeypatch, module, "_softmax_kernel")
    f = saturate_and_extract(lambda x: torch.softmax(x, -1), profile_db=tmp_path / "p.sqlite", profile_budget=0)
    x = torch.randn(4, 300)
    with torch.no_grad():
        torch.testing.assert_close(f(x), torch.softmax(x, -1))
    assert "triton.softmax" in str(f.report), f.report
    assert seen and set(seen) == ({(256, 2)} if recorded else {(512, 4)})


def test_a_region_launches_the_configuration_its_database_row_records(tmp_path, monkeypatch):
    """As a hand kernel does: with no row, a region's generated kernel launches its default (blocks of
    1024 for 1200 elements, four warps); with a row of another configuration at a near shape (as
    ``binding.region_chosen`` records one where it times the region), the plan built launches that."""
    from egraph_opt.kernels.triton import generated
    from egraph_opt.profiling.profile_db import ProfileDB, Record
    from egraph_opt.profiling.profiler import device_name
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")
    load, seen, names = generated._load, [], []
    monkeypatch.setattr(generated, "_load", lambda program: names.append(f"generated_{program.digest[:12]}")
                        or _Spy(load(program), seen))
    x, b = torch.randn(4, 300), torch.randn(300)
    for row in (False, True):
        if row:
            with ProfileDB(tmp_path / "p.sqlite") as db:
                db.add(Record(kernel=names[-1], backend="triton", device=device_name("cpu"), dtype="float32",
                              shapes=((4, 310), (310,)), attrs={}, runs=5, median_s=1e-6, spread_s=0.0,
                              config=generated.GeneratedKernel.configs[1]))
        seen.clear()
        f = saturate_and_extract(lambda x, b: torch.tanh(x * 2.0 + b), profile_db=tmp_path / "p.sqlite",
                                 profile_budget=0)
        with torch.no_grad():
            torch.testing.assert_close(f(x, b), torch.tanh(x * 2.0 + b))
        assert f.report.kernels == {"triton.generated": 1}, f.report
        assert seen and set(seen) == ({(256, 2)} if row else {(1024, 4)})


@pytest.mark.parametrize("max_slowdown", [4.0, 10_000.0])
def test_a_far_more_accurate_plan_slower_than_max_slowdown_falls_back_saying_so(max_slowdown, monkeypatch):
    """Interpreted, the rationalized sqrt difference (30 bits more accurate at worst) runs tens of times
    slower than torch's kernels: beyond the default max_slowdown the original runs, and the report names
    that bound (not stability, which it gains); within a wide one the plan is kept."""
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")
    x = torch.rand(1000) * 1e7
    f = saturate_and_extract(lambda x: torch.sqrt(x + 1) - torch.sqrt(x), max_slowdown=max_slowdown, profile_budget=5.0)
    with torch.no_grad():
        f(x)
    measured = f.report.measured
    assert measured and measured[1] > 20 * measured[0], f.report
    if max_slowdown == 4.0:
        assert "by more than max_slowdown=4, the most accuracy may cost" in f.report.fallback, f.report
    else:
        assert not f.report.fallback and "triton.generated" in str(f.report), f.report
