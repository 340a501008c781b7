import itertools

import pytest
import torch

from egraph_opt import capture, evaluate, optimize, pretty
from egraph_opt.egraph.engine import ENode
from egraph_opt.extractors import ExtractionError
from egraph_opt.extractors.enumerate import alternatives
from egraph_opt.lang.term import postorder


def of_result(optimized):
    """Programs of an optimized program's (first) root, priced as its extraction was."""
    snap = optimized.egraph.snapshot()
    return alternatives(snap.classes, optimized.root_classes[0], optimized.cost)


def n(op, *children, attrs=()):
    return ENode(op, children, attrs)


X = n("input", attrs=("x", "3", "float32"))
TABLE = {"input": 0, "exp": 40, "sin": 3, "cos": 3, "sqrt": 7, "add": 2, "neg": 1, "mul": 2}


def table_cost(cid, node):
    return TABLE[node.op]


def tree_cost(term):
    return sum(TABLE[t.op] for t in postorder([term]))


#: no class computed twice by any program: DAG cost is tree cost, the order is exact
TREE = {
    "x": [X],
    "a": [n("sin", "x"), n("sqrt", "x"), n("exp", "x")],
    "b": [n("cos", "a"), n("neg", "a")],
    "r": [n("add", "b", "x"), n("sqrt", "b"), n("neg", "x")],
}

#: as trees sqrt(sqrt(sqrt(x))) is the cheaper b (21 < 43); as a DAG cos(exp(x)) is, because
#: exp(x) is computed for a anyway and paid once
SHARED = {
    "x": [X],
    "e": [n("exp", "x")],
    "a": [n("sin", "e")],
    "s1": [n("sqrt", "x")], "s2": [n("sqrt", "s1")],
    "b": [n("cos", "e"), n("sqrt", "s2")],
    "r": [n("add", "a", "b"), n("mul", "a", "b")],
}

#: x = neg(y), y = neg(x): neg(neg(x)) is x, so programs can loop
CYCLIC = {
    "x": [X, n("neg", "y")],
    "y": [n("neg", "x"), n("sin", "x")],
    "r": [n("add", "y", "x"), n("exp", "y")],
}


def brute_force(classes, root):
    """Every acyclic program of ``root``, by trying every choice of one e-node per class."""
    ids = sorted(classes)
    programs = {}
    for picks in itertools.product(*(classes[c] for c in ids)):
        choice = dict(zip(ids, picks))
        reached, stack, on_path, acyclic = [], [(root, False)], set(), True
        while stack and acyclic:
            cid, done = stack.pop()
            if done:
                on_path.discard(cid)
                reached.append(cid)
            elif cid in on_path:
                acyclic = False
            elif cid not in reached:
                on_path.add(cid)
                stack.append((cid, True))
                stack.extend((c, False) for c in choice[cid].children)
        if acyclic:
            key = frozenset((c, choice[c]) for c in reached)
            programs[key] = sum(table_cost(c, choice[c]) for c in reached)
    return programs


@pytest.mark.parametrize("classes", [TREE, SHARED, CYCLIC], ids=["tree", "shared", "cyclic"])
def test_every_program_once_with_its_dag_cost(classes):
    found = list(alternatives(classes, "r", table_cost))
    expected = brute_force(classes, "r")
    assert len(found) == len(expected)
    assert len({pretty(a.term) for a in found}) == len(found)  # distinct programs
    for a in found:
        assert expected[frozenset(a.choice.items())] == a.cost
        assert sum(a.parts.values()) == a.cost
        assert sorted(a.parts) == sorted({t.op for t in postorder([a.term])})


def test_without_sharing_the_order_is_exact():
    costs = [a.cost for a in alternatives(TREE, "r", table_cost)]
    assert costs == sorted(brute_force(TREE, "r").values())
    assert costs == [tree_cost(a.term) for a in alternatives(TREE, "r", table_cost)]


def test_shared_subterms_are_paid_once_and_shared():
    first = next(alternatives(SHARED, "r", table_cost))
    assert pretty(first.term) == "sin(exp(x)) + cos(exp(x))"
    assert first.cost == 48
    assert list(first.parts.items()) == [("exp", 40), ("cos", 3), ("sin", 3), ("add", 2),
                                         ("input", 0)]  # by op, largest first
    assert first.term.args[0].args[0] is first.term.args[1].args[0]
    costs = [a.cost for a in alternatives(SHARED, "r", table_cost)]
    assert costs == sorted(brute_force(SHARED, "r").values()) == [48, 48, 66, 66]


def test_cyclic_classes_terminate_with_acyclic_programs():
    found = [pretty(a.term) for a in alternatives(CYCLIC, "r", table_cost)]
    assert sorted(found) == ["-x + x", "exp(-x)", "exp(sin(x))", "sin(x) + x"]
    with pytest.raises(ExtractionError, match="no finite program"):
        next(alternatives({"d": [n("neg", "d")]}, "d", table_cost))


def test_limit_stops_early_and_keeps_the_cheapest():
    everything = list(alternatives(TREE, "r", table_cost))
    assert [a.cost for a in alternatives(TREE, "r", table_cost, limit=3)] == \
        [a.cost for a in everything[:3]]
    assert list(alternatives(TREE, "r", table_cost, limit=0)) == []


def test_deep_programs_need_no_recursion():
    depth = 5000
    classes = {"c0": [X, n("exp", "x")], "x": [X]}
    for i in range(1, depth):
        classes[f"c{i}"] = [n("neg", f"c{i - 1}")]
    classes["r"] = [n("neg", f"c{depth - 1}"), n("sin", f"c{depth - 1}")]
    found = list(alternatives(classes, "r", table_cost))
    assert [a.cost for a in found] == [depth, depth + 2, depth + 40, depth + 42]


def naive_softmax(x):
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


@pytest.fixture(scope="module")
def softmax():
    """Declared finite: an undeclared input may hold +inf, which the max-shifted form turns NaN
    across its row."""
    x = torch.randn(4, 8)
    program, _ = capture(naive_softmax, (x,))
    return program, optimize(program, input_ranges={"x": (-100.0, 100.0)})


SHIFTED = "exp(x - max(x, -1, True)) / sum(exp(x - max(x, -1, True)), -1, True)"


def test_an_undeclared_input_has_no_max_shifted_alternative():
    program, _ = capture(naive_softmax, (torch.randn(4, 8),))
    texts = [pretty(a.term) for a in of_result(optimize(program))]
    assert "softmax(x, -1)" in texts and SHIFTED not in texts


def test_softmax_alternatives_start_at_the_extracted_program(softmax):
    program, optimized = softmax
    found = list(of_result(optimized))
    texts = [pretty(a.term) for a in found]
    assert texts[0] == pretty(optimized.program.roots()[0]) == "softmax(x, -1)"
    assert "exp(x) / sum(exp(x), -1, True)" in texts  # the naive form
    assert SHIFTED in texts
    assert texts.index("exp(x) / sum(exp(x), -1, True)") > 0
    assert [a.cost for a in found] == sorted(a.cost for a in found)

    x = torch.randn(4, 8) * 30
    (want,) = evaluate(program.roots(), {"x": x}, reference=True)
    for a in found:
        (got,) = evaluate([a.term], {"x": x}, reference=True)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=pretty(a.term))
