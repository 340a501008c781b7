"""The catalogue's invariants, checked at import, and guarded rules that must not fire."""
import pytest

from egraph_opt.egraph.engine import EGraph
from egraph_opt.lang.pattern import PatternError
from egraph_opt.rulesets import Exactness, Family, Rule, RuleError, catalogue, select
from egraph_opt.analysis.ranges import analyze
from egraph_opt.lang.term import Term, shapes


@pytest.mark.parametrize("name,lhs,rhs,message", [
    ("Bad_Name", "(exp ?x)", "?x", "kebab-case"),
    ("bare-lhs", "?x", "(exp ?x)", "left side must be an op"),
    ("unbound", "(exp ?x)", "(add ?x ?y)", "unbound"),
    ("sort-clash", "(sum ?x ?a true)", "(softmax ?a -1)", "Tensor"),
])
def test_malformed_rules_fail_at_declaration(name, lhs, rhs, message):
    with pytest.raises((RuleError, PatternError), match=message):
        Rule(name, lhs, rhs, Family.ALGEBRA)


@pytest.mark.parametrize("when,message", [
    (("(positive ?y)",), r"uses \?y, which the left side does not bind"),  # would match any class
    (("(postive ?x)",), "asks 'postive', which no analysis defines"),
    (("(< (hi ?x) 1.0",), "one parenthesized fact"),
    (("positive ?x",), "one parenthesized fact"),
])
def test_guards_are_checked_when_a_rule_is_made(when, message):
    with pytest.raises(RuleError, match=f"exp-log: guard .*{message}"):
        Rule("exp-log", "(exp (log ?x))", "?x", Family.STABILITY, when=when)


def test_precision_guards_are_read_as_data():
    rule = catalogue()["sum-accumulate-float32-float16"]
    assert rule.when.dtypes() == [("x0", "float16")]


@pytest.mark.parametrize("text,message", [
    ("(exp ?x ?y)", "takes 1 operands"),
    ("(frobnicate ?x)", "unknown op"),
    ("(exp ?x", "not one expression"),
    ("(add ?x 1.0)", "use \\(const"),
])
def test_malformed_patterns_say_what_is_wrong(text, message):
    with pytest.raises(PatternError, match=message):
        Rule("r", text, "?x", Family.ALGEBRA)


def test_names_are_unique_and_families_cover_the_catalogue():
    rules = catalogue()
    assert len(rules) >= 15
    assert {r.family for r in rules.values()} >= {Family.STABILITY, Family.FUSION, Family.ALGEBRA}


def test_selection_by_family_rule_or_object_and_unknown_names_fail():
    assert {r.family for r in select(["fusion"])} == {Family.FUSION}
    assert [r.name for r in select("softmax-fuse")] == ["softmax-fuse"]
    custom = Rule("custom", "(exp ?x)", "?x", Family.ALGEBRA, Exactness.UNSAFE)
    assert select([custom]) == [custom]
    with pytest.raises(RuleError, match="unknown ruleset or rule 'stabilty'"):
        select(["stabilty"])


def test_unsafe_rules_are_never_selected_by_default():
    assert all(r.exactness is not Exactness.UNSAFE for r in select())


def _classes_after(rules, term, ranged: bool = False, typed: bool = False):
    """The ops of ``term``'s e-class after ``rules`` ran; ``ranged``: every term carries the
    interval the range analysis gives it (undeclared inputs: their dtype's finite values);
    ``typed``: its shape and dtype (for guards on dtype-of)."""
    eg = EGraph()
    (ref,) = eg.add([term], analyze([term]) if ranged else None, shapes([term]) if typed else None)
    eg.add_rules("r", rules)
    eg.saturate("r", max_iterations=10, max_enodes=1000, max_seconds=5)
    snap = eg.snapshot()
    return {n.op for n in snap.classes[snap.class_of_ref[ref]]}


@pytest.mark.parametrize("name, root", [("sqrt-difference-general", "sqrt"), ("cbrt-difference", "cbrt")])
def test_a_conjugate_needs_an_operand_no_rounding_makes_zero(name, root):
    """sqrt(a) - sqrt(b) = (a - b) / (sqrt a + sqrt b) is 0/0 where a and b both round to 0: b = sigmoid(x) is
    positive over the reals and 0 in float32 below x = -104 (fuzz seed 4201001756); b = 1 + sigmoid(x) is no 0."""
    rule, x = catalogue()[name], Term.input("x", (3,))
    zero = Term.const(0.0) if root == "sqrt" else Term("sigmoid", (Term.input("z", (3,)),))
    def difference(b):
        return Term("sub", (Term(root, (zero,)), Term(root, (b,))))
    assert "div" not in _classes_after([rule], difference(Term("sigmoid", (x,))), ranged=True)
    one_more = Term("add", (Term.const(1.0), Term("sigmoid", (x,))))
    assert "div" in _classes_after([rule], difference(one_more), ranged=True)
    # b in [1e-40, 1e-10] is no 0 in float32 but rounds to 0 in float16 (its least subnormal is 6e-8): no conjugate
    tiny = Term("add", (Term("mul", (Term("sigmoid", (x,)), Term.const(1e-10))), Term.const(1e-40)))
    assert "div" not in _classes_after([rule], difference(tiny), ranged=True)


def test_guarded_division_rule_does_not_fire_on_zero():
    rule = catalogue()["div-const-to-mul"]
    x = Term.input("x", (3,))
    assert _classes_after([rule], Term("div", (x, Term.const(4.0)))) == {"div", "mul"}
    assert _classes_after([rule], Term("div", (x, Term.const(0.0)))) == {"div"}


def test_guarded_scale_out_of_matmul_needs_a_positive_scale():
    """(a * c) @ b = (a @ b) * c keeps zeros' signs only for c > 0 (a @ b = +0, times -1 is -0)."""
    a, b = Term.input("a", (3, 3)), Term.input("b", (3, 3))
    for name, scaled in (("matmul-scale-left-out", lambda c: Term("matmul", (Term("mul", (a, c)), b))),
                         ("matmul-scale-right-out", lambda c: Term("matmul", (a, Term("mul", (b, c)))))):
        rule = catalogue()[name]
        assert _classes_after([rule], scaled(Term.const(0.25))) == {"matmul", "mul"}
        assert _classes_after([rule], scaled(Term.const(-0.25))) == {"matmul"}


def test_tanh_is_not_decomposed_where_its_operand_may_be_zero():
    """2 sigmoid(2x) - 1 is +0 at x = -0, where tanh is -0: an undeclared x may be zero."""
    rule = catalogue()["tanh-as-sigmoid"]
    x = Term.input("x", (3,))
    assert _classes_after([rule], Term("tanh", (x,))) == {"tanh"}
    assert _classes_after([rule], Term("tanh", (Term("exp", (x,)),))) == {"tanh", "sub"}


def test_softmax_fusion_needs_keepdim_and_the_same_operand():
    rules = select(["stability"])
    x, y = Term.input("x", (2, 3)), Term.input("y", (2, 3))
    no_keepdim = Term("div", (Term("exp", (x,)), Term("sum", (Term("exp", (x,)),), (-1, False))))
    other = Term("div", (Term("exp", (x,)), Term("sum", (Term("exp", (y,)),), (-1, True))))
    assert "softmax" not in _classes_after(rules, no_keepdim)
    assert "softmax" not in _classes_after(rules, other)


UNSAFE = [r for r in catalogue().values() if r.exactness is Exactness.UNSAFE]


def test_the_catalogue_quarantines_unsafe_rules():
    assert UNSAFE


@pytest.mark.parametrize("rule", UNSAFE, ids=lambda r: r.name)
def test_each_unsafe_rule_really_breaks_at_its_counterexample(rule):
    """Quarantine is data, checked: at the recorded input the left side is finite and the right
    side is not, or they differ."""
    import math

    import torch

    from egraph_opt.lang import pattern as pat
    from egraph_opt.lang.term import evaluate

    values = dict(rule.counterexample)
    sorts = pat.variables(rule.lhs_pattern)  # tensors are inputs; attributes (a const's ?c) values
    bindings = {v: Term.input(v, ()) if s == pat.TENSOR else values[v] for v, s in sorts.items()}
    env = {v: torch.tensor(values[v], dtype=torch.float64) for v, s in sorts.items() if s == pat.TENSOR}
    lhs, rhs = (float(x) for x in evaluate([pat.instantiate(rule.lhs_pattern, bindings),
                                             pat.instantiate(rule.rhs_pattern, bindings)], env))
    assert not math.isclose(lhs, rhs, rel_tol=1e-9) or math.isnan(lhs) != math.isnan(rhs), (lhs, rhs)


def test_logsumexp_expands_into_its_shifted_form_only_where_no_inf_can_reach_it():
    """max + log(sum(exp(x - max))) is NaN on a row of +-inf, where logsumexp is +-inf: an input
    (finite by definition) may expand, exp(x) (which overflows) may not."""
    rule = catalogue()["log-sum-exp-from-shifted-rev"]
    x = Term.input("x", (3, 4))
    assert _classes_after([rule], Term("logsumexp", (x,), (-1, True)), True) == {"logsumexp", "add"}
    wide = Term("exp", (x,))
    assert _classes_after([rule], Term("logsumexp", (wide,), (-1, True)), True) == {"logsumexp"}


def test_masked_float32_softmax_attention_fuses_in_bfloat16_only():
    """transformers' eager attention in half precision: the rule's dtype guard holds in bfloat16;
    float16 (where it is not declared) and float32 (no rounding to repair) keep the spelled form."""
    rule = catalogue()["attention-fuse-masked-softmax-float32-bfloat16"]

    def attention(dtype):
        q, k, v, m = (Term.input(n, (2, 4, 8, 8), dtype) for n in "qkvm")
        scores = Term("add", (Term("mul", (Term("matmul", (q, Term("transpose", (k,), (-2, -1)))),
                                           Term.const(0.25))), m))
        weights = Term("softmax", (Term("cast", (scores,), ("float32",)),), (-1,))
        return Term("matmul", (Term("cast", (weights,), (dtype,)), v))

    assert _classes_after([rule], attention("bfloat16"), typed=True) == {"matmul", "cast"}
    assert _classes_after([rule], attention("float16"), typed=True) == {"matmul"}
    assert _classes_after([rule], attention("float32"), typed=True) == {"matmul"}
