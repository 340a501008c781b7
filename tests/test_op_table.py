"""Every fact about an op lives in its one declaration (``egraph_opt/lang/ops.py``): this walks the
op table and fails on a non-leaf op with a fact missing, or with a kind no stage dispatches on."""
import dataclasses
import math
import typing

import pytest

from egraph_opt.analysis.ranges import TRANSFER
from egraph_opt.backends.onnx_emitters import EMIT, NO_ONNX_FORM
from egraph_opt.extractors.curvature import FORMULAS
from egraph_opt.lang import pattern
from egraph_opt.lang.ops import OPS, VOCABULARY, Op
from egraph_opt.profiling.profiler import WORK_KINDS

#: facts the stages need of every non-leaf op (``flops`` too, for the per-element work kinds)
FACTS = ("shape_rule", "range_rule", "bounds", "sign", "curvature", "growth", "error", "rounding", "passes",
         "precision", "work", "onnx", "layout")
PER_ELEMENT_WORK = ("pointwise", "select", "reduce", "along", "loss")


def kinds(fact: str) -> set:
    return set(typing.get_args(VOCABULARY[fact]))


def problems(op: Op) -> list[str]:
    """What is missing from, or unknown in, one op's declaration."""
    out = [f"op {op.name!r} does not declare {fact!r}" for fact in FACTS if getattr(op, fact) is None]
    if op.work in PER_ELEMENT_WORK and op.flops is None:
        out.append(f"op {op.name!r} does not declare 'flops' (its work kind {op.work!r} needs it)")
    checks = {
        **{fact: getattr(op, fact) in kinds(fact) for fact in VOCABULARY},
        "range_rule": callable(op.range_rule) or op.range_rule in kinds("range_rule"),
        "curvature": op.curvature in kinds("curvature") or isinstance(op.curvature, tuple) and len(
            op.curvature) == 2 and all(v >= 0 for v in op.curvature),
        "bounds": isinstance(op.bounds, tuple) and len(op.bounds) == 2 and op.bounds[0] <= op.bounds[1],
        "passes": isinstance(op.passes, int) and op.passes > 0,
        "onnx": op.onnx in EMIT or op.name in NO_ONNX_FORM,
    }
    out += [f"op {op.name!r} declares {fact} = {getattr(op, fact)!r}, which no stage knows"
            for fact, ok in checks.items() if not ok and getattr(op, fact) is not None]
    if op.onnx == "definition":  # written out as its definition: one over its own operands
        wanted = {f"x{i}" for i in range(op.arity)} | {name for name, _ in op.attrs}
        found = set(pattern.variables(pattern.parse(op.definition or "?x0")))
        if op.definition is None or found != wanted:
            out.append(f"op {op.name!r} needs a definition over {sorted(wanted)}, has {op.definition!r}")
    return out


@pytest.mark.parametrize("name", [name for name, op in OPS.items() if not op.is_leaf])
def test_every_op_declares_every_fact(name):
    assert problems(OPS[name]) == []


def test_a_fused_op_with_a_fact_missing_is_named():
    """A new op is never priced, ranged or exported by a silent default."""
    new = dataclasses.replace(OPS["logsumexp"], name="fused", passes=None, onnx="NoSuchForm")
    assert problems(new) == ["op 'fused' does not declare 'passes'",
                             "op 'fused' declares onnx = 'NoSuchForm', which no stage knows"]


def test_facts_agree_with_each_other():
    """Facts that imply one another: a fixed range is the declared bounds; an exact op has no
    curvature; an op with a positive sign fact has bounds that allow it."""
    for name, op in OPS.items():
        if op.is_leaf:
            continue
        assert op.range_rule != "bounds" or op.bounds != (-math.inf, math.inf), name
        assert op.rounding != "exact" or op.curvature == (0.0, 1.0), name
        assert op.sign != "positive" or op.bounds[1] > 0, name


def test_each_stage_dispatches_on_the_declared_vocabulary():
    """The stage that dispatches on a fact has a case for each value the op table may declare."""
    assert set(TRANSFER) == kinds("range_rule")
    assert set(FORMULAS) == kinds("curvature")
    assert set(WORK_KINDS) | {"static"} == kinds("work")
    assert {op.work for op in OPS.values() if op.work} - {"static"} <= set(WORK_KINDS)


def test_a_kind_no_stage_knows_fails_at_import():
    with pytest.raises(ValueError, match="sign = 'postive'"):
        dataclasses.replace(OPS["exp"], sign="postive")
