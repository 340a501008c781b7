"""Memory layouts: the strides inferred for each term are those torch's kernels leave, and the
profiling database keeps a kernel's rows per operand layout, so a cost sees the layout it runs on."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from egraph_opt.analysis.layouts import layout_key, operand_layouts, term_strides, with_layout
from egraph_opt.lang.program import Program
from egraph_opt.lang.term import Term, evaluate, postorder, shapes

SHAPE = (2, 3, 4, 5)
ONE = Term.const(1.0)
#: name -> the term it makes of a rank-4 operand: views, elementwise ops, composites that run
STEPS = {
    "permute": lambda t: Term("permute", (t,), ("0,2,1,3",)),
    "permute2": lambda t: Term("permute", (t,), ("3,1,0,2",)),
    "transpose": lambda t: Term("transpose", (t,), (-1, -2)),
    "slice": lambda t: Term("slice", (t,), (-1, 1, 5, 2)),
    "reshape": lambda t: _merged_and_back(t),
    "expand": lambda t: Term("expand", (Term("slice", (t,), (-4, 0, 1, 1)),),
                             (",".join(map(str, shapes([t])[id(t)][0])),)),
    "exp": lambda t: Term("exp", (t,)), "add1": lambda t: Term("add", (t, ONE)),
    "cast": lambda t: Term("cast", (t,), ("float64",)),
    "softmax": lambda t: Term("softmax", (t,), (-1,)),
    "log_softmax2": lambda t: Term("log_softmax", (t,), (-2,)),
    "layer_norm": lambda t: Term("layer_norm", (t, ONE, Term.const(0.0)), (1e-5,)),
    "rms_norm": lambda t: Term("rms_norm", (t, ONE), (1e-5,)),
    "sum": lambda t: Term("sum", (t,), (-1, True)),
    "matmul": lambda t: Term("matmul", (t, Term("transpose", (t,), (-1, -2)))),
    "sdpa": lambda t: Term("sdpa", (t, t, t), (0.5, False)),
}


def _merged_and_back(t):
    """A reshape merging the first two dimensions (a view, or a copy where strides forbid one)
    and one back, so that the chain stays rank 4."""
    shape = shapes([t])[id(t)][0]
    merged = Term("reshape", (t,), (",".join(map(str, (shape[0] * shape[1], *shape[2:]))),))
    return Term("reshape", (merged,), (",".join(map(str, shape)),))


def _chain(names):
    x = Term.input("x", SHAPE)
    t = x
    for name in names:
        t = STEPS[name](t)
    return x, t


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=4))
def test_inferred_strides_are_the_ones_torch_leaves(names):
    x, root = _chain(names)
    program = Program((x,), root)
    strides = term_strides(program.roots(), program.meta())
    env = {"x": torch.randn(SHAPE)}
    for t in (t for t in postorder([root]) if t.op != "const"):
        (value,) = evaluate([t], env)
        shape = program.meta()[id(t)][0]
        assert layout_key(shape, strides[id(t)]) == layout_key(tuple(value.shape), value.stride()), t.op


@pytest.mark.parametrize("key", ["0,2,1,3", "3,2,1,0", "b,0,1,2", "strided", None])
def test_a_layout_is_made_with_the_same_values(key):
    x = torch.randn(SHAPE)
    y = with_layout(x, key)
    assert layout_key(tuple(y.shape), y.stride()) == key
    if key is None or "b" not in key:
        assert torch.equal(y, x)


def test_contiguous_operands_keep_the_keys_rows_had_before_layouts():
    assert operand_layouts([(2, 3), (3,)], [(3, 1), (1,)]) == ()
    assert operand_layouts([(2, 3), (3,)], [(1, 2), (1,)]) == ("1,0", None)


def test_rows_are_kept_per_layout_and_a_cost_reads_its_own(tmp_path):
    """sdpa over heads transposed out of (B, T, H, D) is timed as it runs: its own row, beside
    the contiguous one, and the cost of the program that runs it reads that row."""
    from egraph_opt.extractors import CostModel, Objective, program_cost
    from egraph_opt.kernels.binding import Pricing
    from egraph_opt.profiling.latency import MeasuredLatency
    from egraph_opt.profiling.profile_db import ProfileDB
    from egraph_opt.profiling.profiler import device_name

    q = Term.input("q", (1, 16, 2, 8))
    heads = Term("permute", (q,), ("0,2,1,3",))
    attention = Term("sdpa", (heads, heads, heads), (0.3, False))
    with ProfileDB(tmp_path / "p.sqlite") as db:
        latency = MeasuredLatency(db, "cpu", budget_s=60)
        model = CostModel(Objective.LATENCY, latency_of=Pricing(latency, "cpu"))
        program_cost([attention], model)
        (row,) = db.records("sdpa", "torch", device_name("cpu"), "float32")
        assert row.attrs["layout"] == ["0,2,1,3"] * 3 and row.shapes == ((1, 2, 16, 8),) * 3
        flat = Term("sdpa", (Term.input("k", (1, 2, 16, 8)),) * 3, (0.3, False))
        program_cost([flat], model)  # the same shapes, contiguous: a row of its own
        rows = db.records("sdpa", "torch", device_name("cpu"), "float32")
        assert sorted(str(r.attrs.get("layout")) for r in rows) == ["None", str(["0,2,1,3"] * 3)]
