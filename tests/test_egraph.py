import math

import torch

from egraph_opt import Limits, Phase, capture, optimize
from egraph_opt.egraph.engine import EGraph
from egraph_opt.lang.program import Program, leaves
from egraph_opt.rulesets import Family, Rule, select
from egraph_opt.lang.term import Term, evaluate


def test_equal_structure_shares_one_anchor_and_large_programs_load():
    x = Term.input("x", (3,))
    a, b = Term("exp", (x,)), Term("exp", (x,))  # distinct objects, same structure
    t = x
    for _ in range(5000):
        t = Term("neg", (t,))
    eg = EGraph()
    refs = eg.add([a, b, t])
    assert refs[0] == refs[1]
    snap = eg.snapshot()
    assert snap.num_enodes == 5002 and len(snap.class_of_ref) == 5002


def naive_attention(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True) @ v


def test_default_rules_saturate_a_naive_attention_in_a_small_egraph():
    args = tuple(torch.randn(2, 8, 16) for _ in range(3))
    program, _ = capture(naive_attention, args)
    result = optimize(program)
    (sat,) = result.saturation
    assert sat.stop == "saturated" and sat.iterations <= 10 and sat.enodes <= 100


COMMUTE = Rule("add-commute", "(add ?a ?b)", "(add ?b ?a)", Family.ALGEBRA)
ASSOCIATE = Rule("add-associate", "(add (add ?a ?b) ?c)", "(add ?a (add ?b ?c))", Family.ALGEBRA)


def test_exploding_rules_stop_at_the_enode_limit_and_still_extract_a_correct_program():
    xs = [Term.input(f"x{i}", (3,)) for i in range(12)]
    total = xs[0]
    for x in xs[1:]:
        total = Term("add", (total, x))
    program = Program(tuple(xs), total)
    result = optimize(program, rules=[COMMUTE, ASSOCIATE], limits=Limits(max_enodes=3000))
    (sat,) = result.saturation
    assert sat.stop == "e-node limit (3000)"
    env = {f"x{i}": torch.randn(3, dtype=torch.float64) for i in range(12)}
    (before,) = evaluate([total], env)
    (after,) = evaluate(leaves(result.program.outputs), env)
    torch.testing.assert_close(after, before)


def test_iteration_and_time_limits_say_how_they_stopped():
    x = Term.input("x", (3,))
    t = Term("add", (Term("add", (x, Term("exp", (x,)))), Term("neg", (x,))))
    program = Program((x,), t)
    it = optimize(program, rules=[COMMUTE, ASSOCIATE], limits=Limits(max_iterations=1))
    assert it.saturation[0].stop == "iteration limit (1)"
    timed = optimize(program, rules=[COMMUTE, ASSOCIATE] + select(),
                     limits=Limits(max_seconds=0.0))
    assert timed.saturation[0].stop == "time limit (0 s)"


def test_a_schedule_runs_named_phases_in_order():
    args = tuple(torch.randn(2, 8, 16) for _ in range(3))
    program, _ = capture(naive_attention, args)
    schedule = [Phase("stabilize", tuple(select(["stability", "algebra"]))),
                Phase("fuse", tuple(select(["fusion"])))]
    result = optimize(program, schedule=schedule)
    assert [s.phase for s in result.saturation] == ["stabilize", "fuse"]
    assert result.ops_after == {"sdpa": 1}
    assert result.saturation[1].matches["attention-fuse"] >= 1


def test_a_rule_waits_for_the_ops_it_matches_and_fires_once_they_arrive():
    """Rules are declared only once the e-graph can hold their left side's ops (loaded, or made
    by a declared rule's right side): a rule named by a missing op costs nothing, and still
    fires when a later load brings the op."""
    from egraph_opt.rulesets import catalogue

    x = Term.input("x", (3,))
    eg = EGraph()
    eg.add([Term("exp", (x,))])
    eg.add_rules("phase", [catalogue()["log-exp-cancel"], catalogue()["log1p-expm1-cancel"]])
    assert {r.name for r in eg._waiting["phase"]} == {"log-exp-cancel", "log1p-expm1-cancel"}
    t = Term("log", (Term("exp", (x,)),))
    eg.add([t])  # brings log: log(exp x) -> x is declared now, log1p(expm1 x) still waits
    assert [r.name for r in eg._waiting["phase"]] == ["log1p-expm1-cancel"]
    eg.saturate("phase", max_iterations=5, max_enodes=1000, max_seconds=5.0)
    snap = eg.snapshot()
    assert snap.class_of_ref[eg.ref(t)] == snap.class_of_ref[eg.ref(x)]
