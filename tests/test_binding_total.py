"""Binding and pricing are total over the registry: every op, device, dtype and pair of backends
(operands held by one backend, read by another's kernel) binds to a kernel and is priced, never
raises (a CUDA program once fell back on a missing torch -> triton move)."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from egraph_opt.kernels import binding
from egraph_opt.kernels.registry import ALL_DTYPES, MEMORY, MOVES, REGISTRY, Use, copies
from egraph_opt.lang.ops import OPS
from egraph_opt.profiling.latency import MeasuredLatency
from egraph_opt.profiling.profile_db import ProfileDB
from egraph_opt.analysis.facts import NodeFacts

OPS_WITH_KERNELS = sorted({k.op for k in REGISTRY.values()})
BACKENDS = sorted(MEMORY)
#: an attribute of each egglog sort: limits read them (sdpa's head dim, gelu's approximation)
ATTRS = {"i64": st.sampled_from([-1, 0, 1]), "f64": st.sampled_from([0.125, 1e-5, -1e9]),
         "bool": st.booleans(), "String": st.sampled_from(["none", "tanh", "gelu_tanh", "mean", "2,2"])}


@st.composite
def uses(draw):
    op = draw(st.sampled_from(OPS_WITH_KERNELS))
    spec = OPS[op]
    shapes = tuple(tuple(draw(st.lists(st.integers(0, 130), min_size=0, max_size=4)))
                   for _ in range(spec.arity))
    dtypes = tuple(draw(st.sampled_from(sorted(ALL_DTYPES))) for _ in shapes)
    attrs = tuple(draw(ATTRS[sort]) for _, sort in spec.attrs)
    return Use(op=op, attrs=attrs, shapes=shapes, dtypes=dtypes, device=draw(st.sampled_from(["cpu", "cuda"])))


@pytest.fixture(scope="module")
def latency(tmp_path_factory):
    with ProfileDB(tmp_path_factory.mktemp("total") / "p.sqlite") as db:
        yield MeasuredLatency(db, "cpu", budget_s=0)


def test_every_pair_of_backends_has_a_move_and_only_a_change_of_memory_copies():
    assert set(MOVES) == {(a, b) for a in BACKENDS for b in BACKENDS if a != b}
    assert not copies("torch", "triton") and not copies("triton", "torch") and copies("torch", "numpy")
    use = Use(op="softmax", attrs=(-1,), shapes=((4, 8),), dtypes=("float16",), device="cuda")
    assert binding.conversion_seconds(use, "torch", "triton") == 0.0
    assert binding.conversion_seconds(use, "torch", "numpy") > 0.0


@pytest.mark.parametrize("switch", ["0", "1"])
@settings(max_examples=300, deadline=None, derandomize=True)
@given(use=uses(), held=st.lists(st.sampled_from(BACKENDS), min_size=0, max_size=3))
def test_binding_and_pricing_never_raise(latency, switch, use, held):
    import os
    os.environ["EGRAPH_OPT_TRITON_ON_CPU"] = switch
    try:
        found = binding.paths(use, tuple(held), binding.measured_estimate(latency))
        kernel = binding.bind(use, tuple(held), binding.measured_estimate(latency))
        assert kernel is found[0].kernel and not kernel.refuses(use)
        assert found[0].seconds < math.inf
        for backend in BACKENDS:
            assert binding.conversion_seconds(use, backend, kernel.backend) >= 0.0
        dtype = use.dtypes[0] if use.dtypes else "float32"
        priced = binding.Pricing(latency, use.device)(
            NodeFacts(op=use.op, attrs=use.attrs, shapes=use.shapes, dtype=dtype))
        assert priced is None or priced[0] >= 1
    finally:
        del os.environ["EGRAPH_OPT_TRITON_ON_CPU"]
