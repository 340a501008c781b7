"""Algebra: canonical forms that let the other families match every spelling of a pattern."""
from . import Family, Rule, rules

SHIFTED = "(sub ?x (max ?x ?a true))"  # x - max(x): the max-shifted operand of exp

RULES = rules(Family.ALGEBRA, [
    # name                    lhs                                rhs
    ("mul-const-right",       "(mul (const ?c) ?x)",             "(mul ?x (const ?c))",
                              "constants on the right: one spelling for fusions to match"),
    Rule("div-const-to-mul",  "(div ?x (const ?c))",             "(mul ?x (const (/ 1.0 ?c)))",
         Family.ALGEBRA, when=("(!= ?c 0.0)",), why="x/c = x*(1/c) for c != 0"),
    ("max-shift-idempotent",  f"(sub {SHIFTED} (max {SHIFTED} ?a true))", SHIFTED,
                              "max(x - max x) is exactly 0: shifting twice is shifting once"),
    ("matmul-scale-left-out", "(matmul (mul ?a (const ?c)) ?b)", "(mul (matmul ?a ?b) (const ?c))"),
    ("matmul-scale-right-out", "(matmul ?a (mul ?b (const ?c)))", "(mul (matmul ?a ?b) (const ?c))"),
])
