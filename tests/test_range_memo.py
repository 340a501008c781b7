"""One range analysis per optimize call (issue 14 item 4): every term structure met (input, outer,
extracted, joined programs) takes one transfer step, and its interval is what a fresh analysis of
that program gives."""
import torch

from egraph_opt import capture
from egraph_opt.analysis.ranges import analyze
from egraph_opt.extractors import program_cost
from egraph_opt.lang.term import postorder
from egraph_opt.optimization import pipeline
from test_templates import Stack


def naive_softmax(x):
    return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)


def _counting(monkeypatch):
    """Records each transfer step and each analyze call (by the number of terms it walks)."""
    steps, walks = [], []
    transfer, whole = pipeline.transfer, pipeline.analyze
    monkeypatch.setattr(pipeline, "transfer", lambda t, a, s: steps.append(t) or transfer(t, a, s))
    monkeypatch.setattr(pipeline, "analyze",
                        lambda roots, *rest: walks.append(len(postorder(roots))) or whole(roots, *rest))
    return steps, walks


def test_the_extracted_program_reuses_the_input_analysis_and_agrees_with_a_fresh_one(monkeypatch):
    declared = {"x": (-3.0, 3.0)}
    program, _ = capture(naive_softmax, (torch.randn(4, 8),))
    steps, walks = _counting(monkeypatch)
    memo = pipeline.RangeMemo(declared)
    result = pipeline.optimize(program, input_ranges=declared, ranges=memo)
    assert result.ops_after != result.ops_before  # something new was extracted
    assert walks and set(walks) == {1}  # analyze runs on single leaves only, never a whole program
    before = len(steps)
    best, meta = result.program.roots(), result.program.meta()
    assert memo(best, meta) == analyze(best, declared, None, meta)
    assert len(steps) == before  # every structure of the result was already analyzed


def test_a_templated_program_is_priced_as_a_fresh_analysis_would_price_it(monkeypatch):
    program, _ = capture(Stack(2).eval(), (torch.randn(1, 16, 32),))
    _, walks = _counting(monkeypatch)
    result = pipeline.optimize(program)
    assert any("template of h.0 x2" in s.phase for s in result.saturation)
    assert set(walks) == {1}
    final = result.program
    assert result.cost_after == program_cost(final.roots(), result.model, None, final.leaf_meta(),
                                             final.meta())  # which analyzes it afresh
