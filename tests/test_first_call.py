"""The first call is bounded: no walk of the whole program per node, no arithmetic in capture, and
the references of validation, the error estimate and the timing each within a bound the report
names, while the returned program stays validated."""
import warnings

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

import egraph_opt.drivers.api as api
import egraph_opt.lang.term as term
import egraph_opt.optimization.derivation as derivation
import egraph_opt.validate as validate
from egraph_opt import saturate_and_extract
from egraph_opt.frontends.capture import capture
from egraph_opt.lang.program import Program
from egraph_opt.lang.term import Term
from egraph_opt.rulesets import Exactness, Family, Rule
from egraph_opt.validate import compare, wide_reference


class Block(nn.Module):
    """A pre-norm block with an op the Term language does not hold (cumsum: an opaque call)."""

    def __init__(self, c: int):
        super().__init__()
        self.ln, self.up, self.down = nn.LayerNorm(c), nn.Linear(c, 2 * c), nn.Linear(2 * c, c)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln(x)))) + x.cumsum(-1) * 1e-3


def _visited(blocks: int, monkeypatch) -> int:
    """Terms visited by every walk (``term.topological``) of one first call; the replay of its
    rewrites rebuilds steps within its budget."""
    seen, lifted = [], []
    walk, lift = term.topological, derivation._lift
    monkeypatch.setattr(term, "topological", lambda *a: seen.append(len(out := walk(*a))) or out)
    monkeypatch.setattr(derivation, "_lift", lambda *a: lifted.append(1) or lift(*a))
    torch.manual_seed(0)
    f = saturate_and_extract(nn.Sequential(*[Block(8) for _ in range(blocks)]).eval(), profile_db=False,
                             profile_budget=0)
    with torch.no_grad():
        f(torch.randn(2, 4, 8))
    assert f.report.optimized and f.report.kernels["torch.linear_act"] == blocks, f.report
    monkeypatch.setattr(term, "topological", walk)
    assert len(lifted) <= 2 * derivation.LIFTS_PER_REWRITE * derivation.BUDGET, len(lifted)
    return sum(seen)


def test_the_walks_of_a_first_call_grow_linearly_with_depth(monkeypatch):
    """build_module walked each term's whole past (5,641 walks at 48 blocks), and the replay of the
    rewrites each subterm's at every one of its exponentially many locations: 4x the blocks visited
    900x the terms. Linear now: 4x the blocks, about 4x the terms visited (quadratic: 16x)."""
    few, many = _visited(6, monkeypatch), _visited(24, monkeypatch)
    assert many <= 5 * few, (few, many)


calls: list = []


@torch.fx.wrap
def _seen(x):
    calls.append(isinstance(x, FakeTensor))
    return x


def test_capture_runs_no_arithmetic_on_the_inputs():
    calls.clear()
    capture(lambda x: torch.exp(_seen(x)), (torch.randn(64, 64),))
    assert calls == [True]  # shapes from fake tensors: a large input costs nothing


def test_capture_runs_the_program_where_fake_tensors_cannot_follow():
    calls.clear()
    program, _ = capture(lambda x: torch.exp(_seen(x)) * x.sum().item(), (torch.randn(3),))
    assert calls == [True, False] and program.opaque  # the fake run stopped at .item()


def _f(x):
    return torch.softmax(x, -1) * 2


def _wrong_in_row(row: int):
    def g(x):
        out = _f(x)
        out[row] += 0.1
        return out
    return g


def test_past_its_bound_the_reference_covers_a_sample_of_rows_and_the_rest_is_still_judged(monkeypatch):
    monkeypatch.setattr(validate, "FLOAT64_COST", 1e9)  # as if the reference would take forever
    x = torch.randn(8, 16)
    ok = compare(_f, lambda x: torch.softmax(x, -1) * 2, (x,))
    assert ok.passed and ok.bounded.startswith("float64 reference on 1 of 8 rows"), ok
    for row in (0, 7):  # a wrong row inside the sample and one outside it
        wrong = compare(_f, _wrong_in_row(row), (x,))
        assert not wrong.passed and "exceeds" in wrong.detail, (row, wrong)


def test_rows_that_depend_on_each_other_are_not_sampled(monkeypatch):
    monkeypatch.setattr(validate, "FLOAT64_COST", 1e9)

    def mixed(x):  # each row reads the whole batch: its first row alone is another program
        return x - x.mean(0)
    v = compare(mixed, lambda x: x - x.mean(0), (torch.randn(8, 4),))
    assert v.passed and "alone differs" in v.bounded and "judged against the original" in v.bounded
    assert not compare(mixed, lambda x: x - x.mean(0) + 1e-2, (torch.randn(8, 4),)).passed


def test_an_unsplittable_program_past_its_bound_is_judged_against_the_original(monkeypatch):
    monkeypatch.setattr(validate, "FLOAT64_COST", 1e9)
    x = torch.randn(8, 16)
    v = compare(lambda x: x.exp().sum(), lambda x: x.exp().sum(), (x,))
    assert v.passed and "cannot be split" in v.bounded
    assert not compare(lambda x: x.exp().sum(), lambda x: x.exp().sum() * 1.01, (x,)).passed


def test_a_reference_that_runs_past_its_deadline_is_stopped(monkeypatch):
    monkeypatch.setattr(validate, "FLOAT64_COST", 0.0)  # the estimate fits; the run does not
    x = torch.randn(4, 16)
    v = compare(_f, lambda x: torch.softmax(x, -1) * 2, (x,), budget_s=0.0)
    assert v.passed and "ran past its 0 s bound" in v.bounded
    assert not compare(_f, _wrong_in_row(3), (x,), budget_s=0.0).passed


def test_the_long_double_reference_is_made_only_where_float64_overflowed_and_within_its_bound(monkeypatch):
    made = []

    def wide():
        made.append(1)
        return None
    compare(_f, lambda x: torch.softmax(x, -1) * 2, (torch.randn(4, 4),), wide)
    assert not made  # every float64 value finite: nothing to widen
    x = Term.input("x", (1000,), "float32")
    program = Program((x,), Term("exp", (x,)))
    assert wide_reference(program, (torch.randn(1000),)) is not None
    monkeypatch.setattr(validate, "WIDE_ELEMENTS", 999)
    assert wide_reference(program, (torch.randn(1000),)) is None


def test_the_decorator_reports_what_it_bounded_and_returns_a_validated_plan(monkeypatch):
    monkeypatch.setattr(validate, "FLOAT64_COST", 1e9)
    monkeypatch.setattr(api, "ESTIMATED_UP_TO", 10)
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(8) for _ in range(3)]).eval()
    f = saturate_and_extract(model, profile_db=False, profile_budget=1e-9)
    x = torch.randn(4, 5, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = f(x)
        torch.testing.assert_close(out, model(x))
    report = f.report
    assert report.optimized and report.validation.passed, report
    text = str(report)
    assert "[BOUNDED] validation: float64 reference on 1 of 4 rows" in text, text
    assert "[BOUNDED] error estimate: not made" in text and "[BOUNDED] timing: not timed side by side" in text, text
    assert report.measured is None


@pytest.mark.parametrize("cost, bound, says", [(1e9, 5.0, "1 of 4 rows"), (0.0, 0.0, "ran past")])
def test_a_wrong_rule_is_caught_however_the_reference_was_bounded(cost, bound, says, monkeypatch):
    """Past its bound, validation still runs the plan against the original: the original runs."""
    monkeypatch.setenv("EGRAPH_OPT_TRIPWIRES", "0")
    monkeypatch.setattr(validate, "FLOAT64_COST", cost)
    monkeypatch.setattr(validate, "REFERENCE_SECONDS", bound)
    wrong = Rule("exp-is-identity", "(exp ?x)", "?x", Family.ALGEBRA, Exactness.UNSAFE)
    f = saturate_and_extract(lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True),
                             rulesets=[wrong], profile_db=False)
    x = torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(f(x), torch.softmax(x, -1))
    assert "validation failed" in f.report.fallback and says in f.report.validation.bounded, f.report
