"""The sharding stage: mesh ops on one process, the rules' guards, the textbook choices under the
cost model, and sharded programs on 2 real gloo processes equal to the originals."""
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import egraph_opt
from egraph_opt.egraph.engine import EGraph
from egraph_opt.kernels.torch_ops import TORCH
from egraph_opt.lang.mesh import Local, MeshError
from egraph_opt.lang.ops import OPS
from egraph_opt.lang.term import Term, evaluate, shapes
from egraph_opt.rulesets import Family, Rule, catalogue
from egraph_opt.sharding.cost import DEFAULT_LINKS, Link, fit_links
from egraph_opt.sharding.plan import ShardingError

import test_rule_soundness as proofs

X = Term.input("x", (5, 4), "float64")
#: a link ~40x quicker than gloo on this machine (NVLink-like): where sharding small layers pays
FAST = {name: Link(10e-6, 0.1e-9) for name in DEFAULT_LINKS}


def mesh_op(op, x, *attrs):
    return Term(op, (x,), attrs)


def test_a_shard_holds_each_device_part_and_a_gather_puts_them_back():
    x = torch.randn(5, 4, dtype=torch.float64)
    (parts,) = evaluate([mesh_op("shard", X, -2, 2)], {"x": x})
    assert isinstance(parts, Local) and [p.shape[0] for p in parts.parts] == [3, 2]
    (back,) = evaluate([mesh_op("all_gather", mesh_op("shard", X, -2, 2), -2, 2)], {"x": x})
    assert torch.equal(back, x)


def test_all_reduce_sums_parts_and_a_whole_value_once_per_device():
    x = torch.randn(5, 4, dtype=torch.float64)
    w = torch.randn(4, 3, dtype=torch.float64)
    partial = Term("matmul", (mesh_op("shard", X, -1, 2),
                              mesh_op("shard", Term.input("w", (4, 3), "float64"), -2, 2)))
    total, twice, scattered = evaluate([mesh_op("all_reduce", partial, 2), mesh_op("all_reduce", X, 2),
                                        mesh_op("reduce_scatter", partial, -1, 2)], {"x": x, "w": w})
    torch.testing.assert_close(total, x @ w)
    torch.testing.assert_close(twice, 2 * x)
    assert [p.shape for p in scattered.parts] == [(5, 2), (5, 1)]
    torch.testing.assert_close(torch.cat(scattered.parts, -1), x @ w)


def test_splitting_a_part_again_is_refused():
    with pytest.raises(MeshError, match="whole, not a sharded one"):
        evaluate([mesh_op("shard", mesh_op("shard", X, -1, 2), -1, 2)], {"x": torch.ones(5, 4)})
    with pytest.raises(MeshError, match="along axis -3"):
        evaluate([mesh_op("shard", X, -3, 2)], {"x": torch.ones(5, 4)})


def test_every_mesh_op_is_declared_and_runs_per_device_shapes():
    mesh = {name for name, op in OPS.items() if op.mesh}
    assert mesh == {"shard", "all_gather", "all_reduce", "reduce_scatter"}
    meta = shapes([mesh_op("all_gather", mesh_op("shard", X, -2, 2), -2, 2)])
    assert sorted(m[0] for m in meta.values()) == [(3, 4), (5, 4), (6, 4)]  # a device's shapes


def test_a_wrong_sharding_rule_fails_its_generated_proof():
    """Columns of x @ y are not x's columns times y: the one-process evaluation per device tells."""
    wrong = Rule("shard-matmul-wrong", "(shard (matmul ?x ?y) -1 ?n)", "(matmul (shard ?x -1 ?n) ?y)",
                 Family.SHARDING, sample=(("n", 2), ("x", (4, 6)), ("y", (6, 6))))
    with pytest.raises((AssertionError, RuntimeError)):
        proofs.test_both_sides_agree_in_float64(wrong)


def _class_nodes(term: Term, names: list[str]) -> list:
    """The e-nodes of ``term``'s e-class after the named rules ran (shapes loaded: rank and
    axis-size facts)."""
    eg = EGraph()
    (ref,) = eg.add([term], None, shapes([term]))
    eg.add_rules("r", [catalogue()[n] for n in names])
    eg.saturate("r", max_iterations=10, max_enodes=2000, max_seconds=10)
    snap = eg.snapshot()
    return snap.classes[snap.class_of_ref[ref]]


def _class_ops(term: Term, names: list[str]) -> set[str]:
    return {n.op for n in _class_nodes(term, names)}


def test_a_bias_is_added_whole_only_where_the_split_axis_misses_it():
    bias, full = Term.input("b", (4,), "float64"), Term.input("y", (5, 4), "float64")
    assert "add" in _class_ops(mesh_op("shard", Term("add", (X, bias)), -2, 2), ["shard-into-add-left"])
    assert "add" not in _class_ops(mesh_op("shard", Term("add", (X, full)), -2, 2), ["shard-into-add-left"])
    assert "add" not in _class_ops(mesh_op("shard", Term("add", (X, bias)), -1, 2), ["shard-into-add-left"])


@pytest.mark.parametrize("op,other,axis,fires", [
    ("add", (5, 4), -2, True), ("mul", (5, 4), -1, True),  # a residual add, a gate: split together
    ("add", (1, 4), -2, False),  # size 1 along the split axis: broadcast, each device needs it whole
    ("mul", (1, 4), -1, True),  # broadcast along another axis only
    ("add", (4,), -2, False),  # lower rank: the split axis misses it (shard-into-add-left's case)
    ("sub", (3, 5, 4), -3, False),  # x has no axis -3: x is what broadcasts there
])
def test_two_operands_are_split_together_only_where_both_span_the_axis_alike(op, other, axis, fires):
    y = Term.input("y", other, "float64")
    split = mesh_op("shard", Term(op, (X, y)), axis, 2)
    assert (op in _class_ops(split, [f"shard-into-{op}-both"])) == fires


@pytest.mark.parametrize("other,axes", [((5, 4), [-2, -1]), ((1, 4), [-1]), ((4,), [-1]), ((5, 1), [-2])])
def test_an_elementwise_op_starts_a_split_only_along_axes_both_operands_span(other, axes):
    """add(x, y) is gathered from its split along an axis only where x and y both hold it at
    one size: never along an axis where one operand broadcasts."""
    nodes = _class_nodes(Term("add", (X, Term.input("y", other, "float64"))), ["add-gathered"])
    assert sorted(n.attrs[0] for n in nodes if n.op == "all_gather") == axes


def test_a_reshape_infers_its_minus_one_from_a_device_part():
    t = Term("reshape", (mesh_op("shard", Term.input("x", (3, 8, 32), "float64"), -3, 2),), ("-1,8,2,16",))
    assert shapes([t])[id(t)][0] == (2, 8, 2, 16)  # device 0's part: 2 of the 3 rows
    (parts,) = evaluate([t], {"x": torch.randn(3, 8, 32, dtype=torch.float64)})
    assert [p.shape for p in parts.parts] == [(2, 8, 2, 16), (1, 8, 2, 16)]


@pytest.mark.parametrize("before,after,axis,fires", [
    ((2, 8, 32), (2, 8, 2, 16), -4, True), ((2, 8, 32), (2, 8, 2, 16), -3, True),  # heads split off
    ((2, 8, 2, 16), (2, 8, 32), -2, True),  # and merged back, split along T
    ((2, 8, 32), (2, 8, 2, 16), -2, False),  # along the heads: C is not split alike in general
    ((2, 8, 32), (16, 32), -2, False),  # batch and T merged: the split axis is not kept
    ((5, 4), (20,), -1, False), ((6, 4), (4, 6), -2, False),
])
def test_a_reshape_is_split_only_along_an_axis_it_keeps(before, after, axis, fires):
    reshape = Term("reshape", (Term.input("x", before, "float64"),), (",".join(map(str, after)),))
    assert ("reshape" in _class_ops(mesh_op("shard", reshape, axis, 2), ["shard-into-reshape"])) == fires


def test_softmax_is_split_only_along_another_axis():
    softmax = Term("softmax", (X,), (-1,))
    assert "softmax" in _class_ops(mesh_op("shard", softmax, -2, 2), ["shard-into-softmax"])
    assert "softmax" not in _class_ops(mesh_op("shard", softmax, -1, 2), ["shard-into-softmax"])


@pytest.mark.parametrize("axis,keep,fires", [(-2, True, True), (-1, True, False), (-1, False, True)])
def test_a_sum_is_split_only_along_an_axis_it_keeps(axis, keep, fires):
    """sum over -1 of a (5, 4) value, split along ``axis``: not along the summed axis (the
    partial-sums rule's all-reduce sums parts); without keepdim, axis -1 is x's rows."""
    summed = mesh_op("shard", Term("sum", (X,), (-1, keep)), axis, 2)
    names = ["shard-into-sum-kept", "shard-into-sum-after", "shard-into-sum-before"]
    assert ("sum" in _class_ops(summed, names)) == fires


def test_attention_is_split_by_heads_only_along_a_leading_axis_all_three_share():
    q, kv = (Term.input(n, (2, 4, 6, 3), "float64") for n in ("q", "kv"))
    attention = Term("sdpa", (q, kv, kv), (0.5, True))
    heads = ["shard-into-sdpa-heads"]
    assert "sdpa" in _class_ops(mesh_op("shard", attention, -3, 2), heads)
    assert "sdpa" not in _class_ops(mesh_op("shard", attention, -2, 2), heads)  # queries see all keys
    shared = Term("sdpa", (q, Term.input("k", (6, 3), "float64"), Term.input("v", (6, 3), "float64")),
                  (0.5, False))  # one key set broadcast over the heads: nothing to split
    assert "sdpa" not in _class_ops(mesh_op("shard", shared, -3, 2), heads)
    one = Term.input("one", (1, 4, 6, 3), "float64")  # one key set of rank 4, broadcast over the batch
    assert "sdpa" not in _class_ops(mesh_op("shard", Term("sdpa", (q, one, one), (0.5, True)), -4, 2), heads)
    assert "sdpa" in _class_ops(mesh_op("shard", Term("sdpa", (q, one, one), (0.5, True)), -3, 2), heads)
    derived = Term("transpose", (Term.input("t", (2, 6, 4, 3), "float64"),), (-3, -2))  # heads split off
    attention = Term("sdpa", (derived, derived, derived), (0.5, True))  # by a layout op, as captured
    assert "sdpa" in _class_ops(mesh_op("shard", attention, -4, 2), heads)


def test_an_overflowing_head_takes_the_definition_alone():
    """sdpa decides per attention: a head whose scores overflow does not change the others'."""
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    calm = TORCH["sdpa"](q, k, v, 0.35, False)
    q[0, 1] *= 1e38
    mixed = TORCH["sdpa"](q, k, v, 0.35, False)
    assert torch.equal(mixed[0, 0], calm[0, 0])


def test_rows_of_a_product_with_a_vector_are_not_rows_of_x():
    x3, v = Term.input("x", (4, 5, 3), "float64"), Term.input("v", (3,), "float64")
    rows = ["shard-into-matmul-rows"]
    assert "matmul" not in _class_ops(mesh_op("shard", Term("matmul", (x3, v)), -2, 2), rows)
    assert "matmul" in _class_ops(mesh_op("shard", Term("matmul", (x3, Term.input("w", (3, 2), "float64"))),
                                          -2, 2), rows)


def test_axes_are_compared_only_as_counted_from_the_end():
    """transpose(x, 0, 1) split along -2 is x split along -1: a positive axis is not taken for
    another one."""
    names = ["shard-into-transpose", "shard-into-transpose-first", "shard-into-transpose-second"]
    assert "transpose" not in _class_ops(mesh_op("shard", Term("transpose", (X,), (0, 1)), -2, 2), names)
    assert "transpose" in _class_ops(mesh_op("shard", Term("transpose", (X,), (-2, -1)), -2, 2), names)


def test_sharding_starts_only_from_values_every_device_holds_whole():
    """A product of parts (partial sums) is not gathered as if it were whole."""
    w = Term.input("w", (4, 6), "float64")
    parts = Term("matmul", (mesh_op("shard", X, -1, 2), mesh_op("shard", w, -2, 2)))
    assert "all_gather" not in _class_ops(parts, ["matmul-rows-gathered", "matmul-columns-gathered"])
    assert "all_gather" in _class_ops(Term("matmul", (X, w)), ["matmul-rows-gathered"])


def test_the_default_ruleset_leaves_sharding_to_its_stage():
    from egraph_opt.rulesets import select
    assert not [r for r in select() if r.family is Family.SHARDING]
    assert {r.family for r in select(["sharding"])} == {Family.SHARDING}


def _mlp(d: int, h: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, d))


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory):
    """A latency database with no timings: the latency model's roofline prices every op, the same
    on every machine."""
    return str(tmp_path_factory.mktemp("db") / "profile.sqlite")


def test_large_batch_small_weights_is_data_parallel(empty_db):
    b, d = 4096, 64
    plan = egraph_opt.shard(_mlp(d, d), torch.randn(b, d), mesh=2, links=FAST, profile_db=empty_db)
    assert plan.collectives() == {"all_gather": 1}
    shards = [t for t in plan.placements() if t.op == "shard"]
    assert [(t.args[0].op, t.attrs[0]) for t in shards] == [("input", -2)]  # rows of x; weights whole
    # the derivation: half the rows per device, then one gather of the output
    assert plan.search.best.comm_seconds == pytest.approx(FAST["all_gather"].seconds(b * d * 4, 2), abs=1e-7)
    assert plan.predicted_s < plan.unsharded_s
    assert plan.predicted_s == min(c.seconds for c in plan.alternatives(20))


def test_large_weights_small_batch_is_megatron_column_then_row(empty_db):
    b, d, h = 8, 1024, 1024
    plan = egraph_opt.shard(_mlp(d, h), torch.randn(b, d), mesh=2, links=FAST, profile_db=empty_db)
    assert plan.collectives() == {"all_reduce": 1}
    shards = sorted((t.args[0].attrs[0], t.attrs[0]) for t in plan.placements() if t.op == "shard")
    assert shards == [("0.bias", -1), ("0.weight", -2), ("2.weight", -1)]  # columns, then rows
    assert plan.search.best.comm_seconds == pytest.approx(FAST["all_reduce"].seconds(b * d * 4, 2), abs=1e-7)
    data_parallel = [c for c in plan.alternatives(30) if c.collectives() == {"all_gather": 1}
                     and any(t.op == "shard" and t.args[0].op == "input" for t in _terms(c))]
    assert data_parallel and min(c.seconds for c in data_parallel) > plan.predicted_s
    assert plan.search.best.memory < plan.search.original.memory  # each device holds half the weights


def _terms(candidate):
    from egraph_opt.lang.term import postorder
    return postorder(candidate.roots)


def test_memory_per_device_is_a_constraint(empty_db):
    mlp, x = _mlp(256, 256), torch.randn(4096, 256)  # data parallel is quickest: weights replicated
    free = egraph_opt.shard(mlp, x, mesh=2, links=FAST, profile_db=empty_db)
    limit = free.search.best.memory - 1
    tight = egraph_opt.shard(mlp, x, mesh=2, links=FAST, profile_db=empty_db, memory=limit)
    assert tight.search.best.memory <= limit and tight.predicted_s >= free.predicted_s
    with pytest.raises(ShardingError, match="fits 1000 bytes"):
        egraph_opt.shard(mlp, x, mesh=2, links=FAST, profile_db=empty_db, memory=1000)


def test_report_placements_and_explore_show_the_choice(empty_db):
    plan = egraph_opt.shard(_mlp(64, 64), torch.randn(4096, 64), mesh=2, links=FAST, profile_db=empty_db)
    text = plan.report
    assert "[PREDICTED] 1 device" in text and "all_gather" in text and "split -2" in text
    table = egraph_opt.explore(plan)
    assert len(table) >= 3 and table[0].seconds == plan.predicted_s
    assert [row[0] for row in table.rows] == list(range(len(table)))


def test_bad_requests_fail_clearly():
    with pytest.raises(ShardingError, match="mesh is a number of devices"):
        egraph_opt.shard(_mlp(4, 4), torch.randn(2, 4), mesh=0)
    plan = egraph_opt.shard(_mlp(4, 4), torch.randn(2, 4), mesh=2, profile_db=False)
    with pytest.raises(TypeError, match="shape 2,4"):
        plan.run(torch.randn(3, 4))
    with pytest.raises(MeshError, match="under torchrun"):
        plan.run_local(torch.randn(2, 4))


def test_collective_links_fit_alpha_and_beta():
    link = Link(300e-6, 1e-9)
    timings = [(name, b, link.seconds(b, 2)) for name in DEFAULT_LINKS for b in (4096, 65536, 1 << 20)]
    fitted = fit_links(timings)
    assert fitted["all_reduce"].alpha_s == pytest.approx(300e-6, rel=1e-6)
    assert fitted["all_gather"].beta_s == pytest.approx(1e-9, rel=1e-6)


class Block(nn.Module):
    """A GPT-2-style transformer block."""

    def __init__(self, c: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for y in self.qkv(self.ln1(x)).split(c, dim=2))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(nn.functional.gelu(self.fc(self.ln2(x))))


CHEAP = {name: Link(1e-9, 1e-15) for name in DEFAULT_LINKS}  # communication nearly free: shard


def test_mlp_runs_megatron_on_two_gloo_processes(empty_db):
    mlp, x = _mlp(256, 512), torch.randn(4, 256)
    plan = egraph_opt.shard(mlp, x, mesh=2, links=FAST, profile_db=empty_db)
    assert plan.collectives() == {"all_reduce": 1}
    torch.testing.assert_close(plan.run(x), mlp(x), rtol=1e-5, atol=1e-5)


def test_transformer_block_runs_on_two_gloo_processes(empty_db):
    """Data parallel through the whole block: the heads split off the batch-split activations
    and merged back (reshapes that keep the batch axis), attention per batch item, both residual
    adds part to part, and one gather of the output (roofline prices: the same choice everywhere)."""
    torch.manual_seed(1)
    block, x = Block(64).eval(), torch.randn(4, 32, 64)
    plan = egraph_opt.shard(block, x, mesh=2, links=CHEAP, profile_db=empty_db, profile_budget=0)
    assert plan.collectives() == {"all_gather": 1} and plan.terms[0].op == "all_gather"
    table = plan.placements()
    places = {(t.op, row[2]) for row, t in zip(table.rows, table.items) if t is not plan.terms[0]}
    assert {p for op, p in places} <= {"split -3", "split -4"} and ("add", "split -3") in places
    assert ("sdpa", "split -4") in places and ("reshape", "split -4") in places
    with torch.no_grad():
        torch.testing.assert_close(plan.run(x), block(x), rtol=1e-5, atol=1e-5)


TORCHRUN_SCRIPT = """
import sys, torch, torch.nn as nn, egraph_opt
from egraph_opt.sharding.cost import Link
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
x = torch.randn(4, 256)
fast = {name: Link(10e-6, 0.1e-9) for name in ("all_gather", "all_reduce", "reduce_scatter")}
plan = egraph_opt.shard(mlp, x, mesh=2, links=fast, profile_db=sys.argv[1])
y = plan.run_local(x)
torch.testing.assert_close(y, mlp(x), rtol=1e-5, atol=1e-5)
rank = torch.distributed.get_rank()
with open(f"{sys.argv[2]}/rank{rank}.txt", "w") as f:  # not stdout: the ranks' lines interleave
    f.write(f"rank {rank} equal {sorted(plan.collectives())}")
"""


def test_run_local_runs_this_rank_under_torchrun(tmp_path, empty_db):
    from egraph_opt.sharding.run import free_port
    script = tmp_path / "part.py"
    script.write_text(TORCHRUN_SCRIPT)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          f"--master_port={free_port()}", str(script), empty_db, str(tmp_path)], capture_output=True,
                         text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == [
        "rank 0 equal ['all_reduce']", "rank 1 equal ['all_reduce']"]
