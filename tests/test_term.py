import pytest

from hypothesis import given, strategies as st

from egraph_opt.lang.term import Term, TermError, evaluate, postorder, pretty, op_counts, topological


def test_deep_chains_walk_without_recursion():
    t = Term.input("x", (3,))
    for _ in range(20_000):
        t = Term("neg", (t,))
    assert len(postorder([t])) == 20_001
    import torch
    assert torch.equal(evaluate([t], {"x": torch.ones(3)})[0], torch.ones(3))


def test_shared_subterms_are_visited_once():
    x = Term.input("x", (2,))
    e = Term("exp", (x,))
    t = Term("div", (e, Term("sum", (e,), (-1, True))))
    assert [u.op for u in postorder([t])] == ["input", "exp", "sum", "div"]
    assert op_counts([t]) == {"div": 1, "exp": 1, "sum": 1}


@given(st.lists(st.lists(st.integers(0, 11), max_size=4), min_size=12, max_size=12), st.booleans())
def test_a_walk_orders_a_dag_and_ends_on_a_cycle(edges, acyclic):
    """Each item once, after the items it uses; an e-graph's classes may reach themselves (a cycle),
    where the walk must still end (a cycle once grew a test worker to 19 GB)."""
    deps = [[d for d in ds if d > i or not acyclic] for i, ds in enumerate(edges)]
    order = topological([0, 5], deps.__getitem__, int)
    assert len(order) == len(set(order))
    at = {item: i for i, item in enumerate(order)}
    reached = {0, 5}
    for item in order:
        reached.update(deps[item])
    assert set(order) == reached
    if acyclic:
        assert all(at[d] < at[i] for i in order for d in deps[i])


def test_pretty_infix_respects_precedence():
    x, y = Term.input("x"), Term.input("y")
    t = Term("mul", (Term("add", (x, y)), Term("neg", (Term("sub", (x, y)),))))
    assert pretty(t) == "(x + y) * -(x - y)"


@pytest.mark.parametrize("op,args,attrs,message", [
    ("nope", (), (), "unknown op"),
    ("exp", (), (), "takes 1 operands"),
    ("sum", (Term.input("x"),), ("a", True), "axis must be i64"),
])
def test_malformed_terms_are_refused_with_the_reason(op, args, attrs, message):
    with pytest.raises(TermError, match=message):
        Term(op, args, attrs)


def test_reference_evaluation_is_float64_and_float_casts_are_exact():
    import torch
    x = Term.input("x", (4,), "float16")
    t = Term("cast", (Term("exp", (x,)),), ("float16",))
    value = torch.tensor([1.0, 2.0, 3.0, 12.0], dtype=torch.float16)
    ref = evaluate([t], {"x": value}, reference=True)[0]
    assert ref.dtype == torch.float64 and torch.isfinite(ref).all()
    assert evaluate([t], {"x": value})[0].isinf().any()  # exp(12) overflows float16
