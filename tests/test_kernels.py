"""The kernel registry: each kernel against its reference term, and binding by device, dtype and
shape, conversions between backends included."""
import math
import warnings

import pytest
import torch

from egraph_opt import capture, optimize
from egraph_opt.drivers.cli import main as cli
from egraph_opt.kernels import binding, registry
from egraph_opt.kernels.registry import REGISTRY, Use
from egraph_opt.lang.pattern import instantiate, parse, variables
from egraph_opt.lang.term import Term, evaluate
from egraph_opt.backends.torch_backend import build_module
from egraph_opt.analysis.facts import NodeFacts

R = torch.randn
#: operands and attributes to run each op's kernels on (odd sizes, more than one block of rows)
EXAMPLES = {
    "softmax": ([R(3, 37)], {"axis": -1}), "log_softmax": ([R(5, 33)], {"axis": -1}),
    "logsumexp": ([R(4, 21)], {"axis": -1, "keepdim": True}),
    "layer_norm": ([R(3, 24), R(24), R(24)], {"eps": 1e-5}),
    "sdpa": ([R(2, 9, 16), R(2, 7, 16), R(2, 7, 16)], {"scale": 0.25, "causal": False}),
    "sdpa_masked": ([R(2, 9, 16), R(2, 7, 16), R(2, 7, 16),
                     R(9, 7).masked_fill(R(9, 7) > 1, -math.inf)], {"scale": 0.25}),
    "sdpa_filled": ([R(2, 9, 16), R(2, 7, 16), R(2, 7, 16),
                     torch.ones(9, 7, dtype=torch.bool).tril()], {"scale": 0.25, "fill": -3.4e38}),
    "linear_act": ([R(5, 12), R(7, 12), R(7)], {"activation": "gelu"}),
    "cross_entropy": ([R(6, 1100), torch.tensor([0, 1099, -100, 5, 700, 3])],
                      {"reduction": "mean", "ignore_index": -100}),
    **{op: ([R(4, 6).abs() + 0.1], {}) for op in registry._NUMPY_UNARY},
}


def _run(kernel, operands, attrs):
    spec_attrs = [attrs[name] for name, _ in registry.OPS[kernel.op].attrs]
    if kernel.backend == "numpy":
        return registry.from_numpy(kernel.impl(*[registry.to_numpy(x) for x in operands], *spec_attrs))
    return kernel.impl(*operands, *spec_attrs)


TESTED = [k for k in REGISTRY.values() if k.backend != "torch" and k.op in EXAMPLES]


@pytest.mark.parametrize("kernel", TESTED, ids=lambda k: k.name)
def test_kernel_matches_its_reference_term(kernel):
    pytest.importorskip("triton") if kernel.backend == "triton" else None
    operands, attrs = EXAMPLES[kernel.op]
    pattern = parse(kernel.reference)
    sorts = variables(pattern)
    bindings = {name: attrs[name] for name in sorts if name in attrs}
    bindings.update({f"x{i}": Term.input(f"x{i}", tuple(x.shape)) for i, x in enumerate(operands)})
    (reference,) = evaluate([instantiate(pattern, bindings)],
                            {f"x{i}": x for i, x in enumerate(operands)}, reference=True)
    got = _run(kernel, operands, attrs)  # Triton: interpreted on CPU tensors
    torch.testing.assert_close(got.double(), reference, rtol=1e-5, atol=1e-5)


def test_every_fused_op_the_triton_backend_covers_is_in_the_examples():
    assert {k.op for k in REGISTRY.values() if k.backend == "triton"} <= set(EXAMPLES)


def _use(op="softmax", dtype="float16", device="cuda", shapes=((8, 64),), attrs=(-1,)):
    return Use(op=op, attrs=attrs, shapes=shapes, dtypes=(dtype,) * len(shapes), device=device)


def test_cpu_nodes_bind_to_torch_kernels():
    assert binding.bind(_use(device="cpu")).name == "torch.softmax"


def _triton_measured_faster(kernel, use):
    return 1e-6 if kernel.backend == "triton" else 2e-6


def test_cuda_nodes_bind_to_triton_where_it_runs_and_is_measured_faster(monkeypatch):
    monkeypatch.setattr(binding.triton_kernels, "available", lambda device: True)
    assert binding.bind(_use()).name == "torch.softmax"  # nothing measured: no preference
    assert binding.bind(_use(), estimate=_triton_measured_faster).name == "triton.softmax"
    assert binding.bind(_use(dtype="float64"), estimate=_triton_measured_faster).name == "torch.softmax"
    sdpa = _use("sdpa", shapes=((2, 8, 8),) * 3, attrs=(0.3, False))
    assert binding.bind(sdpa, estimate=_triton_measured_faster).name == "torch.sdpa"  # head dim 8
    monkeypatch.setattr(binding.triton_kernels, "available", lambda device: False)
    assert binding.bind(_use(), estimate=_triton_measured_faster).name == "torch.softmax"  # not native


def test_each_kernel_has_its_own_rows_and_extraction_prices_the_kernel_binding_chooses(tmp_path):
    """numpy's exp measured (its own rows, backend "numpy") beside torch's: binding takes the
    faster, and the cost model's price is that kernel's."""
    from egraph_opt.profiling.latency import MeasuredLatency, UNIT_S
    from egraph_opt.profiling.profile_db import ProfileDB, Record
    from egraph_opt.profiling.profiler import device_name

    use = Use(op="exp", attrs=(), shapes=((64, 64),), dtypes=("float32",), device="cpu")
    with ProfileDB(tmp_path / "p.sqlite") as db:
        latency = MeasuredLatency(db, "cpu", budget_s=0)
        assert binding.Pricing(latency, "cpu")(NodeFacts(op="exp", shapes=((64, 64),)))[1] == "default"
        for backend, seconds in (("torch", 8e-6), ("numpy", 1e-6)):
            db.add(Record(kernel="exp", backend=backend, device=device_name("cpu"), dtype="float32", shapes=((64, 64),), attrs={}, runs=5, median_s=seconds, spread_s=0.0))
        latency = MeasuredLatency(db, "cpu", budget_s=0)
        ways = binding.paths(use, ("torch",), binding.measured_estimate(latency))
        assert [p.kernel.name for p in ways] == ["numpy.exp", "torch.exp"]  # with its conversions
        assert ways[0].seconds > 1e-6 and ways[1].seconds == 8e-6
        assert binding.bind(use, estimate=binding.measured_estimate(latency)).name == "numpy.exp"
        moves = binding.conversion_seconds(use, "torch", "numpy")  # not measured: static
        assert binding.Pricing(latency, "cpu")(NodeFacts(op="exp", shapes=((64, 64),))) == (
            round(1e-6 / UNIT_S) + round(moves / UNIT_S), "measured")
        timed = MeasuredLatency(db, "cpu", budget_s=60)  # tanh unmeasured: both backends timed now
        binding.Pricing(timed, "cpu")(NodeFacts(op="tanh", shapes=((64, 64),)))
        assert all(db.records("tanh", b, device_name("cpu"), "float32") for b in ("torch", "numpy"))
        assert db.records("move", "move.torch->numpy", device_name("cpu"), "float32")  # its move too


def test_moves_are_measured_kernels_and_binding_pays_what_they_take(tmp_path):
    """A move into numpy memory measured slow makes numpy's (faster) exp lose; measured fast, win."""
    from egraph_opt.profiling.latency import MeasuredLatency
    from egraph_opt.profiling.profile_db import ProfileDB, Record
    from egraph_opt.profiling.profiler import device_name

    use, where = Use(op="exp", attrs=(), shapes=((64, 64),), dtypes=("float32",), device="cpu"), device_name("cpu")
    with ProfileDB(tmp_path / "p.sqlite") as db:
        for kernel, backend, seconds in (("exp", "torch", 8e-6), ("exp", "numpy", 1e-6),
                                         ("move", "move.torch->numpy", 9e-6)):
            db.add(Record(kernel=kernel, backend=backend, device=where, dtype="float32", shapes=((64, 64),), attrs={}, runs=5, median_s=seconds, spread_s=0.0))
        slow = binding.measured_estimate(MeasuredLatency(db, "cpu", budget_s=0))
        assert binding.conversion_seconds(use, "torch", "numpy", slow) == 9e-6
        assert binding.bind(use, ("torch",), slow).name == "torch.exp"
        assert binding.bind(use, ("numpy",), slow).name == "numpy.exp"  # already in numpy memory
        db.add(Record(kernel="move", backend="move.torch->numpy", device=where, dtype="float32", shapes=((64, 64),), attrs={}, runs=5, median_s=1e-7, spread_s=0.0))
        fast = binding.measured_estimate(MeasuredLatency(db, "cpu", budget_s=0))
        assert binding.bind(use, ("torch",), fast).name == "numpy.exp"
        timed = MeasuredLatency(db, "cpu", budget_s=60)  # an unmeasured shape is timed now
        x = registry.MOVES["numpy", "torch"]
        seconds = binding.measured_estimate(timed)(x, Use(op="move", attrs=(), shapes=((32, 8),), dtypes=("float32",), device="cpu"))
        (row,) = db.records("move", "move.numpy->torch", where, "float32")
        assert row.shapes == ((32, 8),) and seconds == pytest.approx(row.median_s, abs=1e-7)  # in units of 0.1 us


def test_numpy_kernels_pay_their_conversions_and_run_correctly_when_chosen():
    x = Term.input("x", (4, 6))
    program_term = Term("exp", (Term("tanh", (x,)),))
    from egraph_opt.lang.program import Program
    program = Program((x,), program_term)
    assert build_module(program).kernels == {"torch.exp": 1, "torch.tanh": 1}
    numpy_first = lambda k, use: 1.0 if k.backend == "torch" else 0.0  # noqa: E731
    module = build_module(program, estimate=numpy_first)
    assert module.kernels == {"numpy.exp": 1, "numpy.tanh": 1}
    assert module.code.count("registry_to_numpy(") == 1 and module.code.count("registry_from_numpy(") == 1
    value = torch.randn(4, 6)
    torch.testing.assert_close(module(value), torch.exp(torch.tanh(value)))


def test_kernels_command_lists_the_registry(capsys):
    assert cli(["kernels"]) == 0
    out = capsys.readouterr().out
    assert "torch.softmax" in out and "triton.sdpa" in out and "move.torch->numpy" in out
    assert f"{len(REGISTRY) + len(registry.MOVES)} kernels" in out


def test_missing_triton_degrades_to_torch_with_one_warning():
    import subprocess
    import sys
    code = ("import sys; sys.modules['triton'] = None\n"
            "import warnings; warnings.simplefilter('always')\n"
            "from egraph_opt.kernels import triton as t\n"
            "from egraph_opt.kernels import binding\n"
            "from egraph_opt.kernels.registry import Use\n"
            "print(t.available(), t.available(), binding.bind(Use(op='softmax', attrs=(-1,), shapes=((4, 8),), dtypes=('float16',), device='cuda')).name)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "torch.softmax"]
    assert done.stderr.lower().count("triton") >= 1 and done.stderr.count("Warning") <= 1


def test_a_triton_kernel_declared_beside_its_wrapper_is_registered(monkeypatch):
    from egraph_opt.kernels.triton import runtime
    monkeypatch.setattr(runtime, "TRITON_KERNELS", {})  # what a new kernel module's import fills
    monkeypatch.setattr("egraph_opt.kernels.triton.TRITON_KERNELS", runtime.TRITON_KERNELS)
    wide = runtime.implements("exp", limits=lambda use: "too wide" if use.shapes[0][-1] > 8 else None)
    fn = wide(lambda x: x.exp())
    (kernel,) = registry._triton_kernels()
    assert (kernel.name, kernel.reference, kernel.impl) == ("triton.exp", "(exp ?x0)", fn)
    assert kernel.refuses(_use("exp", shapes=((4, 16),), attrs=())) == "too wide"
    assert kernel.refuses(_use("exp", shapes=((4, 8),), attrs=())) is None


REWRITTEN = [k for k in REGISTRY.values() if k.backend == "torch" and k.db_backend != "torch" and "cpu" in k.devices]
#: where floating point ends: both infinities, NaN, signed zeros, gelu's underflow and x^3's overflow
EDGES = [-math.inf, math.inf, math.nan, -0.0, 0.0, -1e-30, -9.0, -30.0, -100.0, -1e20, 1e20, 7e12]


@pytest.mark.parametrize("kernel, dtype", [(k, d) for k in REWRITTEN for d in (torch.float32, torch.float64)
                                           if str(d).removeprefix("torch.") in k.dtypes],
                         ids=lambda p: getattr(p, "name", str(p)))
def test_rewritten_kernels_match_their_reference_term_at_the_edges_too(kernel, dtype):
    """A torch kernel computing an op by another formula equals the op's definition (float64
    truth) within rounding, with the definition's NaNs and the signs of its zeros. (Where tanh(z)
    nears -1, 1 + tanh(z) cancels even in float64: the truth is -0 at x = -9, the kernel's
    x sigmoid(2z) -1e-28, so relative errors are asserted only away from zero.)"""
    pattern = parse(kernel.reference)
    attrs = {name: next(a for a in ("tanh", "gelu_tanh") if kernel.refuses(
        Use(op=kernel.op, attrs=(a,), shapes=(), dtypes=(), device="cpu")) is None) for name in variables(pattern) if not name.startswith("x")}
    x = torch.cat([torch.tensor(EDGES), 4 * R(500, dtype=torch.float64)]).to(dtype)
    operands = [x.reshape(-1, 8)] if kernel.op == "gelu" else [x.reshape(-1, 8), R(5, 8, dtype=dtype), R(5, dtype=dtype)]
    bindings = {**attrs, **{f"x{i}": Term.input(f"x{i}", tuple(t.shape)) for i, t in enumerate(operands)}}
    (truth,) = evaluate([instantiate(pattern, bindings)], {f"x{i}": t for i, t in enumerate(operands)},
                        reference=True)
    got = kernel.impl(*operands, *attrs.values())
    own = REGISTRY[f"torch.{kernel.op}"].impl(*operands, *attrs.values())  # what it stands in for
    assert got.dtype == dtype
    numbers = ~truth.isnan()  # a NaN's sign bit is the CPU's choice (vector and scalar paths differ)
    assert torch.equal(got.isnan(), truth.isnan()) and torch.equal(got.signbit()[numbers], truth.signbit()[numbers])
    error, own_error = ((y.double() - truth).nan_to_num().abs() for y in (got, own))
    bulk = truth.abs() > 1e-2  # as close to the truth as the op's own kernel, and within rounding
    assert error.max() <= 1.5 * own_error.max() + 1e-12
    assert (error / truth.abs())[bulk].max() <= (1e-5 if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rewritten_kernels_differentiate_as_the_definition(dtype):
    """Each rewritten kernel's gradients are its op's (float64: the formulas agree to rounding). oneDNN's linear has no
    backward, and autograd would pass no gradient through it silently: where autograd records, torch's runs."""
    x = R(64, 32, dtype=dtype, requires_grad=True)
    w, b = R(16, 32, dtype=dtype, requires_grad=True), R(16, dtype=dtype)
    cases = [("linear", (x, w, b), [x, w])] + [("gelu", (x, "tanh"), [x]), ("linear_act", (x, w, b, "gelu_tanh"), [x, w])] \
        * (dtype == torch.float64)
    for kernel, args, wrt in cases:
        own, rewritten = REGISTRY[f"torch.{kernel}"].impl, next(k.impl for k in REWRITTEN if k.op == kernel)
        grads = [torch.autograd.grad(f(*args).square().sum(), wrt) for f in (own, rewritten)]
        for got, expected in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, expected)


def test_cublas_epilogue_is_a_cuda_candidate_for_tanh_gelu_only():
    """torch._addmm_activation's use_gelu is tanh-gelu on CUDA (erf-gelu on CPU) and its relu
    epilogue may clip NaN: it is weighed for (linear_act "gelu_tanh") on CUDA, with a bias of one
    value per output, beside torch's and Triton's kernels; the CPU's candidates are unchanged."""
    shapes = ((4, 8), (3, 8), (3,))
    names = lambda act, dtype, device, shapes=shapes: {  # noqa: E731
        k.name for k in registry.kernels_for("linear_act") if not k.refuses(_use("linear_act", dtype, device, shapes, (act,)))}
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        assert "torch.linear_gelu_tanh_epilogue" in names("gelu_tanh", dtype, "cuda")
        assert "torch.linear_gelu_tanh_epilogue" not in names("gelu_tanh", dtype, "cpu")
    assert "triton.linear_act" in names("gelu_tanh", "float16", "cuda")
    assert not {"torch.linear_gelu_tanh_epilogue"} & (names("gelu", "float16", "cuda") | names("relu", "float16", "cuda")
                                                       | names("gelu_tanh", "float16", "cuda", ((4, 8), (3, 8), ())))
    assert names("gelu_tanh", "float32", "cpu") == {"torch.linear_act", "torch.linear_gelu_tanh_sigmoid", "triton.linear_act"}


def test_the_budget_is_kept_for_nodes_whose_kernels_binding_chooses_between(tmp_path, monkeypatch):
    """A node's only kernel is timed in the first half of the budget; the kernels of a node with a
    choice (torch's and Triton's cross entropy on CUDA) in all of it: without rows, binding could
    only take torch's, whatever Triton's would measure."""
    from egraph_opt.profiling import latency as L
    from egraph_opt.profiling.profile_db import ProfileDB

    monkeypatch.setattr(binding.triton_kernels, "available", lambda device: True)
    asked = []
    pricing = binding.Pricing(None, "cuda")
    pricing.latency = lambda n, kernel, choice: asked.append((kernel.name, choice))
    pricing(NodeFacts(op="cross_entropy", attrs=("mean", -100), shapes=((8, 50), (8,)), dtype="float16"))
    pricing(NodeFacts(op="exp", shapes=((8, 50),), dtype="float16"))
    assert asked == [("torch.cross_entropy", True), ("triton.cross_entropy", True), ("torch.exp", False)]
    monkeypatch.setattr(L, "machine_busy", lambda: None)
    with ProfileDB(tmp_path / "p.sqlite") as db:
        timed = L.MeasuredLatency(db, "cpu", budget_s=60, spent_s=40)
        tanh = NodeFacts(op="tanh", shapes=((64, 64),))
        assert timed(tanh, REGISTRY["torch.tanh"], choice=False)[1] == "default" and timed.profiled == 0
        assert timed(tanh, REGISTRY["numpy.tanh"], choice=True)[1] == "measured" and timed.profiled == 1


def test_rewritten_kernels_refuse_what_they_do_not_compute():
    gelu = REGISTRY["torch.gelu_tanh_sigmoid"]
    assert gelu.refuses(_use("gelu", "float32", "cpu", ((4, 8),), ("none",))) == "only approximate='tanh', not 'none'"
    assert "float16" in gelu.refuses(_use("gelu", "float16", "cpu", ((4, 8),), ("tanh",)))
    linear = REGISTRY["torch.linear_gelu_tanh_sigmoid"]
    assert linear.refuses(_use("linear_act", "float32", "cpu", ((4, 8), (3, 8), (3,)), ("relu",)))
    onednn = REGISTRY["torch.linear_onednn"]  # float32 on the host, a 2-D weight of K > 0 and a bias per output
    assert onednn.refuses(_use("linear", "float32", "cpu", ((2, 4, 8), (3, 8), (3,)), ())) is None
    for dtype, device, shapes in (("float64", "cpu", ((4, 8), (3, 8), (3,))), ("float32", "cuda", ((4, 8), (3, 8), (3,))),
                                  ("float32", "cpu", ((4, 8), (3, 8), ())), ("float32", "cpu", ((4, 0), (3, 0), (3,))),
                                  ("float32", "cpu", ((4, 8), (2, 3, 8), (3,)))):
        assert onednn.refuses(_use("linear", dtype, device, shapes, ())), (dtype, device, shapes)


def test_a_rewritten_kernel_is_chosen_only_where_measured_faster(tmp_path):
    """Unmeasured, the op's own kernel runs (no preference); each kernel has its own rows, and
    the faster measured one is bound and priced; timing a miss times both."""
    from egraph_opt.profiling.latency import MeasuredLatency, UNIT_S
    from egraph_opt.profiling.profile_db import ProfileDB, Record
    from egraph_opt.profiling.profiler import device_name

    shapes, where = ((64, 64),), device_name("cpu")
    use = Use(op="gelu", attrs=("tanh",), shapes=shapes, dtypes=("float32",), device="cpu")
    with ProfileDB(tmp_path / "p.sqlite") as db:
        latency = MeasuredLatency(db, "cpu", budget_s=0)
        assert binding.bind(use, estimate=binding.measured_estimate(latency)).name == "torch.gelu"
        for rows, seconds in (("torch", 8e-6), ("torch.gelu_tanh_sigmoid", 3e-6)):
            db.add(Record(kernel="gelu", backend=rows, device=where, dtype="float32", shapes=shapes, attrs={"approximate": "tanh"}, runs=5, median_s=seconds, spread_s=0.0))
        latency = MeasuredLatency(db, "cpu", budget_s=0)
        assert binding.bind(use, estimate=binding.measured_estimate(latency)).name == "torch.gelu_tanh_sigmoid"
        assert binding.Pricing(latency, "cpu")(NodeFacts(op="gelu", attrs=("tanh",), shapes=shapes)) == (round(3e-6 / UNIT_S), "measured")
        slower = Use(op="gelu", attrs=("tanh",), shapes=((32, 64),), dtypes=("float32",), device="cpu")
        db.add(Record(kernel="gelu", backend="torch.gelu_tanh_sigmoid", device=where, dtype="float32", shapes=((32, 64),), attrs={"approximate": "tanh"}, runs=5, median_s=9e-6, spread_s=0.0))
        db.add(Record(kernel="gelu", backend="torch", device=where, dtype="float32", shapes=((32, 64),), attrs={"approximate": "tanh"}, runs=5, median_s=2e-6, spread_s=0.0))
        assert binding.bind(slower, estimate=binding.measured_estimate(MeasuredLatency(db, "cpu"))).name == "torch.gelu"
        timed = MeasuredLatency(db, "cpu", budget_s=60)
        binding.Pricing(timed, "cpu")(
            NodeFacts(op="linear_act", attrs=("gelu_tanh",), shapes=((16, 8), (4, 8), (4,))))
        assert all(db.records("linear_act", rows, where, "float32")
                   for rows in ("torch", "torch.linear_gelu_tanh_sigmoid"))


@pytest.mark.parametrize("op", list(registry._NUMPY_UNARY))
def test_numpy_kernels_round_float32_once(op):
    """numpy's own float32 loops are less accurate than torch's (exp on AVX2: 2.4 ulps, 61% correctly rounded), so
    a plan binding numpy for speed would lose bits: each numpy kernel computes float32 in float64 and rounds once,
    within half an ulp (and a float64 libm's few) of torch's float64 value, NaN and inf where torch gives them."""
    x = torch.cat([torch.randn(4096, generator=torch.Generator().manual_seed(0)).abs() * 20 + 1e-3,
                   torch.tensor([0.0, math.inf, math.nan, 88.8, 1e-30])]).float()
    out = registry.from_numpy(REGISTRY[f"numpy.{op}"].impl(registry.to_numpy(x)))
    truth = getattr(torch, op)(x.double())
    assert out.dtype == torch.float32 and torch.equal(out.isnan(), truth.float().isnan())
    finite = truth.float().isfinite() & (truth.abs() >= torch.finfo(torch.float32).tiny)
    ulp = (truth[finite].float().abs().nextafter(torch.tensor(math.inf)) - truth[finite].float().abs()).double()
    assert ((out[finite].double() - truth[finite]).abs() <= ulp * (0.5 + 1e-6)).all()
    assert torch.equal(out[~finite & ~out.isnan()], truth.float()[~finite & ~out.isnan()])
