"""Sharding: where each value of a program lives on a mesh of n devices (Tapestry's rewrites).

Placements are explicit terms (``lang/mesh.py``): ``(shard x a n)`` is x split along axis a, one part per device;
``(all_gather s a n)``, ``(all_reduce p n)`` and ``(reduce_scatter p a n)`` are the communication. Every other op in a
sharded program runs on each device's parts.

- introductions (for one mesh size): an op equals its sharded result gathered back, or the sum of its partial
  products (a matmul split along its reduction axis, with one all-reduce);
- propagation, rooted at ``shard``: a shard of an op's result is the op over shards of its operands (rows of a matmul,
  its columns, heads of attention, rows of a layer norm, elementwise ops, reductions and softmax along another axis);
  a replicated operand the split axis does not reach (a bias) stays whole; two operands that both span the split axis
  at one size (a residual add) are split together;
- resharding: a gather then a shard along the same axis cancel; a shard of an all-reduce is a reduce-scatter.

The search over them is global: the sharding stage extracts the cheapest program under its cost (``sharding/cost.py``).
Proofs are the catalogue's generated tests: both sides, evaluated in one process with every device's part, agree."""
from __future__ import annotations

import re

from egraph_opt.lang import pattern as pat
from egraph_opt.lang.ops import BINARY_ELEMENTWISE, OPS, REDUCTIONS, UNARY_ELEMENTWISE

from . import Exactness, Family, Rule

_S = Family.SHARDING
MESH = 2  # the mesh size the catalogue's introductions are declared (and proven) for
#: shapes the proofs sample: a linear's (x, weight, bias), and a bias-like operand (rank 1)
_LINEAR, _N = (("x", (4, 6)), ("w", (8, 6)), ("b", (8,))), (("n", MESH),)
#: two operands both hold the split axis, at one static size (a size-1 or missing axis would
#: broadcast: each device would need the whole of that operand, not its part)
_SAME_SPAN = "(= (axis-size ?x ?a) (axis-size ?y ?a))"


def _whole(*texts: str) -> tuple[str, ...]:
    """A value is split only where every device holds it whole: ``(whole ?v)`` for each ``?v``
    a shard takes (splitting a part again, or gathering it, would mix devices' parts)."""
    return tuple(f"(whole ?{v})" for v in dict.fromkeys(v for t in texts for v in re.findall(r"\(shard \?(\w+)", t)))


def _rule(name, lhs, rhs, *, when=(), sample=(), exactness=Exactness.EXACT, why="", binds=()) -> Rule:
    return Rule(name, lhs, rhs, _S, exactness, when=_whole(lhs, rhs) + tuple(when),
                sample=_N + tuple(sample), why=why, binds=binds)


def _elementwise() -> list[Rule]:
    """Elementwise ops follow the placement of their operands."""
    out = [_rule(f"shard-into-{op.replace('_', '-')}", f"(shard ({op} ?x{OPS[op].attr_vars}) ?a ?n)",
                 f"({op} (shard ?x ?a ?n){OPS[op].attr_vars})",
                 sample=[(k, v) for k, v in OPS[op].sample if k in dict(OPS[op].attrs)])
           for op in UNARY_ELEMENTWISE]
    for op in BINARY_ELEMENTWISE:  # one operand sharded, the other whole (a constant, or one the axis misses), or both
        name = op.replace("_", "-")
        out += [
            _rule(f"shard-into-{name}-left", f"(shard ({op} ?x ?y) ?a ?n)", f"({op} (shard ?x ?a ?n) ?y)",
                  when=("(< (rank ?y) (- 0 ?a))",), sample=(("y", (5,)),),
                  why="?y has fewer axes than the split reaches: every device adds it whole"),
            _rule(f"shard-into-{name}-right", f"(shard ({op} ?y ?x) ?a ?n)", f"({op} ?y (shard ?x ?a ?n))",
                  when=("(< (rank ?y) (- 0 ?a))",), sample=(("y", (5,)),)),
            _rule(f"shard-into-{name}-const", f"(shard ({op} ?x (const ?c)) ?a ?n)",
                  f"({op} (shard ?x ?a ?n) (const ?c))"),
            _rule(f"shard-into-const-{name}", f"(shard ({op} (const ?c) ?x) ?a ?n)",
                  f"({op} (const ?c) (shard ?x ?a ?n))"),
            _rule(f"shard-into-{name}-both", f"(shard ({op} ?x ?y) ?a ?n)",
                  f"({op} (shard ?x ?a ?n) (shard ?y ?a ?n))", when=(_SAME_SPAN,),
                  sample=(("y", (1, 5)),), why="a residual add: both span the split axis alike (neither "
                  "is broadcast along it), so part r of one meets part r of the other")]
    return out


def _along_other_axes() -> list[Rule]:
    """Reductions and softmax along an axis the split leaves whole (axes compared as counted from
    the end, as the capture writes them: a positive one is another spelling, never matched)."""
    out = []
    for op in REDUCTIONS:
        name, rest = op.replace("_", "-"), OPS[op].attr_vars.replace(" ?axis ?keepdim", "")
        out += [
            _rule(f"shard-into-{name}-kept", f"(shard ({op} ?x ?r true{rest}) ?a ?n)",
                  f"({op} (shard ?x ?a ?n) ?r true{rest})", when=("(!= ?a ?r)", "(< ?r 0)")),
            _rule(f"shard-into-{name}-after", f"(shard ({op} ?x ?r false{rest}) ?a ?n)",
                  f"({op} (shard ?x ?a ?n) ?r false{rest})", when=("(> ?a ?r)", "(< ?r 0)")),
            _rule(f"shard-into-{name}-before", f"(shard ({op} ?x ?r false{rest}) ?a ?n)",
                  f"({op} (shard ?x (- ?a 1) ?n) ?r false{rest})", when=("(<= ?a ?r)", "(< ?r 0)"),
                  why="axes from the reduced one's place leftward count one further from the end in ?x")]
    return out + [_rule(f"shard-into-{op.replace('_', '-')}", f"(shard ({op} ?x ?r) ?a ?n)",
                        f"({op} (shard ?x ?a ?n) ?r)", when=("(!= ?a ?r)", "(< ?r 0)"))
                  for op in ("softmax", "log_softmax")]


RULES = _elementwise() + _along_other_axes() + [
    # name                      lhs                                       rhs
    _rule("shard-into-linear-rows", "(shard (linear ?x ?w ?b) ?a ?n)", "(linear (shard ?x ?a ?n) ?w ?b)",
          when=("(< ?a -1)",), sample=_LINEAR, why="data parallel: rows of x, weights whole"),
    _rule("shard-into-linear-columns", "(shard (linear ?x ?w ?b) -1 ?n)",
          "(linear ?x (shard ?w -2 ?n) (shard ?b -1 ?n))", when=("(= (rank ?b) 1)",), sample=_LINEAR,
          why="column parallel: each device computes its output features"),
    _rule("shard-into-matmul-rows", "(shard (matmul ?x ?y) -2 ?n)", "(matmul (shard ?x -2 ?n) ?y)",
          when=("(> (rank ?y) 1)",), why="x @ a vector has no column axis: its axis -2 is x's -3"),
    _rule("shard-into-matmul-columns", "(shard (matmul ?x ?y) -1 ?n)", "(matmul ?x (shard ?y -1 ?n))"),
    _rule("shard-into-sdpa-queries", "(shard (sdpa ?q ?k ?v ?s false) -2 ?n)",
          "(sdpa (shard ?q -2 ?n) ?k ?v ?s false)", why="queries split, every key seen (no mask)"),
    _rule("shard-into-sdpa-heads", "(shard (sdpa ?q ?k ?v ?s ?c) ?a ?n)",
          "(sdpa (shard ?q ?a ?n) (shard ?k ?a ?n) (shard ?v ?a ?n) ?s ?c)",
          when=("(< ?a -2)", "(= (axis-size ?q ?a) (axis-size ?k ?a))", "(= (axis-size ?k ?a) (axis-size ?v ?a))"),
          sample=(("a", -3), ("s", 0.5), ("c", False)), why="each head (or batch item) attends alone"),
    _rule("shard-into-layer-norm-rows", "(shard (layer_norm ?x ?w ?b ?e) ?a ?n)",
          "(layer_norm (shard ?x ?a ?n) ?w ?b ?e)", when=("(< ?a -1)",),
          sample=(("x", (4, 6)), ("w", (6,)), ("b", (6,))), why="normalized over the last axis only"),
    _rule("shard-into-transpose", "(shard (transpose ?x ?i ?j) ?a ?n)", "(transpose (shard ?x ?a ?n) ?i ?j)",
          when=("(!= ?a ?i)", "(!= ?a ?j)", "(< ?i 0)", "(< ?j 0)"), sample=(("i", -3), ("j", -2))),
    _rule("shard-into-transpose-first", "(shard (transpose ?x ?a ?j) ?a ?n)",
          "(transpose (shard ?x ?j ?n) ?a ?j)", when=("(< ?j 0)",), sample=(("j", -1),)),
    _rule("shard-into-transpose-second", "(shard (transpose ?x ?i ?a) ?a ?n)",
          "(transpose (shard ?x ?i ?n) ?i ?a)", when=("(< ?i 0)",), sample=(("i", -3),)),
    _rule("shard-into-reshape", "(shard (reshape ?x ?s) ?a ?n)", "(reshape (shard ?x ?b ?n) ?t)",
          when=("(= ?b (reshape-axis ?x ?s ?a))", "(= ?t (reshape-part ?x ?s ?a))"), binds=("b", "t:String"),
          sample=(("x", (4, 6, 10)), ("s", "4,6,2,5"), ("a", -3), ("b", -2), ("t", "4,-1,2,5")),
          why="heads split off (or merged into) C, the split axis kept whole: the same rows either way"),
    _rule("shard-into-slice", "(shard (slice ?x ?c ?s ?e ?t) ?a ?n)", "(slice (shard ?x ?a ?n) ?c ?s ?e ?t)",
          when=("(!= ?a ?c)", "(< ?c 0)"), sample=(("s", 1), ("e", 4), ("t", 1))),
    _rule("shard-into-concat", "(shard (concat ?x ?y ?c) ?a ?n)",
          "(concat (shard ?x ?a ?n) (shard ?y ?a ?n) ?c)", when=("(!= ?a ?c)", "(< ?c 0)")),
    # resharding
    _rule("gather-of-shard", "(all_gather (shard ?x ?a ?n) ?a ?n)", "?x"),
    _rule("shard-of-gather", "(shard (all_gather ?s ?a ?n) ?a ?n)", "?s",
          why="the parts gathered are the parts a split gives back"),
    _rule("reduce-scatter", "(shard (all_reduce ?p ?n) ?a ?n)", "(reduce_scatter ?p ?a ?n)")]


def introductions(n: int) -> list[Rule]:
    """Where sharding starts on ``n`` devices: an op is its sharded result gathered back (rows, columns,
    heads; an elementwise op along any axis its operands both span), or its partial products all-reduced."""
    def whole(lhs: str) -> tuple[str, ...]:  # the op's result is whole: so are its operands
        return tuple(f"(whole ?{v})" for v, sort in pat.variables(pat.parse(lhs)).items() if sort == pat.TENSOR)
    def gathered(name, op, axis, when=(), sample=()):
        return Rule(f"{name}-gathered", op, f"(all_gather (shard {op} {axis} {n}) {axis} {n})", _S,
                    when=whole(op) + when, sample=sample)
    spans = [Rule(f"{op.replace('_', '-')}-gathered", f"({op} ?x ?y)",
                  f"(all_gather (shard ({op} ?x ?y) ?a {n}) ?a {n})", _S, when=whole(f"({op} ?x ?y)")
                  + (_SAME_SPAN,), binds=("a",), sample=(("y", (1, 5)),),
                  why="along any axis both operands span alike: a residual add split where its "
                  "operands already are") for op in BINARY_ELEMENTWISE]
    return spans + [
        gathered("linear-rows", "(linear ?x ?w ?b)", -2, sample=_LINEAR),
        gathered("linear-columns", "(linear ?x ?w ?b)", -1, sample=_LINEAR),
        gathered("matmul-rows", "(matmul ?x ?y)", -2),
        gathered("matmul-columns", "(matmul ?x ?y)", -1),
        gathered("sdpa-heads", "(sdpa ?q ?k ?v ?s ?c)", -3, sample=(("s", 0.5), ("c", False))),
        gathered("layer-norm-rows", "(layer_norm ?x ?w ?b ?e)", -2, sample=(("x", (4, 6)), ("w", (6,)), ("b", (6,)))),
        Rule("linear-partial-sums", "(linear ?x ?w ?b)",
             f"(add (all_reduce (matmul (shard ?x -1 {n}) (transpose (shard ?w -1 {n}) -2 -1)) {n}) ?b)",
             _S, Exactness.REASSOC, when=whole("(linear ?x ?w ?b)"), sample=_LINEAR,
             why="row parallel: each device multiplies its slice of the reduction axis; one all-reduce"),
        Rule("matmul-partial-sums", "(matmul ?x ?y)", f"(all_reduce (matmul (shard ?x -1 {n}) (shard ?y -2 {n})) {n})",
             _S, Exactness.REASSOC, when=whole("(matmul ?x ?y)") + ("(> (rank ?y) 1)",)),
        Rule("sum-partial-sums", "(sum ?x ?r ?k)", f"(all_reduce (sum (shard ?x ?r {n}) ?r ?k) {n})",
             _S, Exactness.REASSOC, when=whole("(sum ?x ?r ?k)") + ("(< ?r 0)",))]


RULES += introductions(MESH)


def for_mesh(n: int) -> list[Rule]:
    """The ruleset for a mesh of ``n`` devices: the catalogue's, introductions declared for ``n``."""
    if n == MESH:
        return list(RULES)
    intro = {r.name for r in introductions(MESH)}
    return [r for r in RULES if r.name not in intro] + introductions(n)
