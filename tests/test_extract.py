import pytest

from egraph_opt.egraph.engine import ENode
from egraph_opt.extractors import CostModel, ExtractionError, NodeFacts, Objective, extract
from egraph_opt.lang.term import postorder



def n(op, *children, attrs=()):
    return ENode(op, children, attrs)


TABLE = {"input": 0, "exp": 40, "sin": 3, "cos": 3, "sqrt": 7, "add": 2, "neg": 1}


def table_cost(cid, node):
    return TABLE[node.op]


def test_shared_subterm_is_paid_once():
    """Tree costs pick add(sin(e), sqrt^3(x)) (66 < 88); as a DAG exp(x) is paid once, so
    add(sin(e), cos(e)) costs 48 and wins."""
    classes = {
        "x": [n("input", attrs=("x", "3", "float32"))],
        "e": [n("exp", "x")],
        "a": [n("sin", "e")],
        "b": [n("cos", "e")],
        "s1": [n("sqrt", "x")], "s2": [n("sqrt", "s1")], "s3": [n("sqrt", "s2")],
        "root": [n("add", "a", "s3"), n("add", "a", "b")],
    }
    (term,) = extract(classes, ["root"], table_cost)
    assert [t.op for t in postorder([term])] == ["input", "exp", "sin", "cos", "add"]
    assert term.args[0].args[0] is term.args[1].args[0]  # one exp(x), shared
    assert sum(TABLE[t.op] for t in postorder([term])) == 48


def test_self_referencing_classes_extract_their_finite_member():
    classes = {"x": [n("input", attrs=("x", "3", "float32")), n("neg", "y")],
               "y": [n("neg", "x")]}
    (term,) = extract(classes, ["y"], table_cost)
    assert [t.op for t in postorder([term])] == ["input", "neg"]


def test_a_class_without_a_finite_program_is_an_error():
    with pytest.raises(ExtractionError, match="no finite program"):
        extract({"d": [n("neg", "d")]}, ["d"], table_cost)


def test_objectives_rank_stable_forms_below_naive_ones_on_unbounded_ranges():
    for objective in Objective:
        model = CostModel(objective, tolerance=1e-3 if objective is Objective.TOLERANCE else None)
        cost = lambda op: model(NodeFacts(op))  # noqa: E731 - every range unbounded
        naive = cost("exp") + cost("sum") + cost("div")
        assert cost("softmax") < naive, objective
        assert cost("log_softmax") < cost("log") + naive, objective
