"""explore(): tables with values the extractor used, runnable alternatives, why-not findings, a
derivation that ends at the output (and feeds the report), pictures and pages that are written."""
import collections
import html.parser
import warnings

import pytest
import torch

from egraph_opt import capture, explore, optimize, saturate_and_extract
from egraph_opt.drivers import api, pictures
from egraph_opt.drivers.explore import ExploreError
from egraph_opt.lang.term import pretty
from egraph_opt.validate import Validation

RANGES = {"x": (1.0, 1e6)}


@pytest.fixture(scope="module")
def rationalized():
    @saturate_and_extract(input_ranges=RANGES, profile_db=False, profile_budget=0)  # no timing: the load decides none
    def f(x):
        return torch.sqrt(1 + x) - torch.sqrt(x)
    f(torch.rand(8) * 100 + 1)
    return f, explore(f)


def test_report_rewrites_come_from_a_derivation_that_reaches_the_output(rationalized):
    f, ex = rationalized
    assert "[REWRITE] sqrt-difference" in str(f.report)
    assert "no rule improved" not in str(f.report)
    steps = f.report.derivation.steps
    assert f.report.derivation.complete
    assert pretty(steps[0].before) in ("sqrt(1.0 + x) - sqrt(x)", "sqrt(x + 1.0) - sqrt(x)")  # as captured
    assert pretty(steps[-1].after) == pretty(ex.result.program.roots()[0])
    for a, b in zip(steps, steps[1:]):  # each step starts where the last one ended
        assert pretty(a.after) == pretty(b.before)


def half_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / 4.0, -1) @ v


class QKV(torch.nn.Module):  # three projections of one input
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

    def forward(self, x):
        return self.q(x), self.k(x), self.v(x)


HALF = torch.float16


@pytest.mark.parametrize("make, shapes, dtype, rule, roots", [
    (lambda: half_attention, [(2, 4, 8, 16)] * 3, HALF, "attention-fuse-softmax-float32-float16", 1),
    (lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).half(),
     [(4, 16)], HALF, "linear-accumulate-float32-float16", 1),
    (lambda: QKV().eval(), [(2, 8, 32)], torch.float32, "linear-horizontal-fuse-3", 3),
], ids=["float16-attention", "float16-mlp", "qkv-projection"])
def test_derivation_replays_casts_and_rules_of_several_roots(make, shapes, dtype, rule, roots):
    torch.manual_seed(0)
    program, _ = capture(make(), [torch.randn(s, dtype=dtype) for s in shapes])
    result = optimize(program)
    d = result.derivation
    assert d.complete and "not replayed" not in str(d)
    states = d.states()
    for step, state in zip(d.steps, states):  # each step rewrites the program it is applied to
        for part in (step, *step.together):
            assert pretty(state[part.path[0]]) == pretty(part.before)
    assert [pretty(t) for t in states[-1]] == [pretty(t) for t in result.program.roots()]
    step = next(s for s in d.steps if s.name == rule)
    assert len(step.together) == roots - 1  # a rule of several roots is one step over them
    assert rule in [r.name for r, _ in result.applied]


def test_classes_and_members_carry_the_extractors_costs(rationalized):
    _, ex = rationalized
    root = ex.root_classes[0]
    row = next(r for r in ex.classes().rows if r[0] == root)
    assert set(row[1].split(", ")) == {"sub", "div"} and row[5].startswith("div(")
    assert [r[0] for r in ex.classes(changed=True).rows] == [c for c in ex.classes(changed=True)]
    members = ex.eclass(root)
    by_op = {n.op: r for n, r in zip(members, members.rows) if n.op == "sub" or r[0] == "*"}
    assert by_op["sub"][7] == "input" and by_op["div"][7] in ("sqrt-difference", "sqrt-shift-difference")
    assert by_op["div"][0] == "*" and by_op["div"][2] < by_op["sub"][2]
    assert by_op["sub"][3] > by_op["div"][3]  # the cancellation is what costs
    assert "<table>" in members._repr_html_()


def test_alternatives_are_cheapest_first_and_run(rationalized):
    f, ex = rationalized
    alts = ex.alternatives(4)
    costs = [a.cost for a in alts]
    assert costs == sorted(costs) and len(alts) == 4
    assert alts[0].cost == ex.extracted.cost
    x = torch.rand(8) * 1e5 + 1
    truth = torch.sqrt(1 + x.double()) - torch.sqrt(x.double())
    for a in alts:
        assert torch.allclose(a(x).double(), truth, rtol=1e-2)
    naive = next(a for a in alts if "-" in str(a))
    assert naive.error_bits > alts[0].error_bits + 10


def test_why_not_a_program_and_a_rule(rationalized):
    _, ex = rationalized
    naive = next(a for a in ex.alternatives(4) if "-" in str(a))
    table = ex.why_not(naive)
    assert table.rows[0][1] < table.rows[0][2] and "costs" in table.note
    assert "matches nowhere" in str(ex.why_not("log-product"))
    with pytest.raises(KeyError, match="no rule"):
        ex.why_not("no-such-rule")


def test_why_not_names_the_unproved_guard_and_the_undeclared_range():
    @saturate_and_extract
    def g(a, b):
        return torch.log(a * b)
    g(torch.rand(4) + 0.5, torch.rand(4) + 0.5)
    text = str(explore(g).why_not("log-product"))
    assert "(positive ?a) is not proved" in text and "no declared range for a, b" in text


def test_derivation_table_prices_each_step(rationalized):
    _, ex = rationalized
    table = ex.derivation()
    rule = next(r for r in table.rows if r[1] == "sqrt-difference")
    assert float(rule[5]) > float(rule[6]) + 10  # error bits before and after the step
    assert "complete" in table.note
    impact = {r[0]: r for r in ex.impact().rows}
    assert impact["sqrt-difference"][2] > 10


def test_clear_messages_for_nothing_to_explore():
    f = saturate_and_extract(lambda x: torch.exp(x))
    with pytest.raises(ExploreError, match="never been called"):
        explore(f)

    m = saturate_and_extract(lambda x: x * torch.rand_like(x))  # a draw from the caller's generator: refused
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m(torch.rand(3))
    with pytest.raises(ExploreError, match="fell back to the original program before an e-graph"):
        explore(m)
    opaque = saturate_and_extract(lambda x: torch.fft.fft(x).real)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opaque(torch.rand(4))
    with pytest.raises(ExploreError, match="(entirely opaque|fell back)"):
        explore(opaque)
    with pytest.raises(ExploreError, match="not int"):
        explore(3)



@pytest.mark.parametrize("why,patch,objective", [  # a latency objective takes no stability gain
    ("it measured slower (2.0 us against 1.8 us)", ("time_side_by_side", lambda *a: (1.8e-6, 2.0e-6)), "latency"),
    ("validation failed: output 0: off", ("compare", lambda *a, **k: Validation(False, max_error=1.0, detail="output 0: off")),
     "balanced")])
def test_a_plan_that_fell_back_is_explored_and_says_why(why, patch, objective, monkeypatch):
    """What the optimizer found, its cost beside the input program's, and its e-graph, with the
    reason it does not run at the top; the original program runs."""
    monkeypatch.setattr(api, *patch)

    def naive(x):
        return torch.log(torch.softmax(x, -1))
    # no latency database: static prices, and a budget only the (patched) side-by-side timing uses
    f = saturate_and_extract(naive, objective=objective, profile_db=False, profile_budget=1.0)
    x = torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(f(x), naive(x))
    ex = explore(f)
    summary = ex.summary()
    assert summary.title.startswith(f"{ex.name}: not taken: {why}") and ex.name.endswith("naive")
    assert str(ex).startswith(summary.title)
    found, source = summary.items
    assert (str(found), str(source)) == ("log_softmax(x, -1)", "log(softmax(x, -1))") and found is ex.extracted
    assert found.cost < source.cost  # priced as extraction priced them
    assert len(ex.eclass(ex.root_classes[0])) >= 2 and "<svg" in pictures.egraph_picture(ex).text


def test_pictures_draw_or_say_why(rationalized, tmp_path, monkeypatch):
    _, ex = rationalized
    svg = pictures.egraph_picture(ex)
    assert isinstance(svg, pictures.SVG) and "<svg" in svg.text and svg.text.count(pictures.CHOSEN) >= 4
    assert "<svg" in open(svg.save(tmp_path / "g.svg")).read()
    assert "too many to draw" in str(pictures.egraph_picture(ex, max_nodes=3))
    around = pictures.egraph_picture(ex, around=ex.root_classes[0], radius=1)
    assert around.text.count("<title>cluster_") < svg.text.count("<title>cluster_")
    monkeypatch.setenv("EGRAPH_OPT_DOT", str(tmp_path / "missing"))
    text = pictures.egraph_picture(ex)
    assert str(text).startswith("Graphviz dot not found") and ex.root_classes[0] in str(text)


def test_figures_and_pages_are_written(rationalized, tmp_path):
    f, ex = rationalized
    errors = pictures.precision_errors(f, [torch.rand(8) * 1e5 + 1])
    float32 = errors.rows[0]
    assert float32[0] == "float32" and float32[2] < float32[1]
    for fig in (pictures.impact_figure(ex), pictures.precision_figure(f, [torch.rand(8) * 1e5 + 1])):
        fig.savefig(tmp_path / "fig.png")
        assert (tmp_path / "fig.png").stat().st_size > 1000
    page = open(f.report.to_html(tmp_path / "r.html")).read()
    assert "sqrt-difference" in page and "<svg" in page and "<table>" in page


def test_a_dropped_e_graph_says_to_keep_it():
    f = saturate_and_extract(lambda x: torch.log(1 + x), input_ranges={"x": (0.0, 1.0)})
    f(torch.rand(4))
    f(torch.rand(5))  # a second optimization: the first plan's e-graph is dropped
    f(torch.rand(4))
    with pytest.raises(ExploreError, match="keep_egraph=True"):
        explore(f)
    kept = saturate_and_extract(lambda x: torch.log(1 + x), input_ranges={"x": (0.0, 1.0)},
                                keep_egraph=True)
    for n in (4, 5, 4):
        kept(torch.rand(n))
    assert "log1p-from-log" in str(explore(kept).derivation())


class Tags(html.parser.HTMLParser):
    """An HTML page's elements: each counted, headings' text, and those left open at its end."""
    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self):
        super().__init__()
        self.count, self.open, self.headings = collections.Counter(), [], []

    def handle_starttag(self, tag, attrs):
        self.count[tag] += 1
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open.pop() == tag, f"</{tag}> closes <{self.open[-1:]}>"

    def handle_data(self, data):
        if self.open and self.open[-1] == "h4":
            self.headings.append(data)


class LogSumExp(torch.nn.Module):
    def forward(self, x):
        return torch.log(torch.exp(x).sum(-1))


def test_onnx_batch_writes_one_page_and_a_model_is_explored(tmp_path):
    pytest.importorskip("onnx")
    import json

    from egraph_opt.drivers.cli import main
    path = tmp_path / "models" / "lse.onnx"
    path.parent.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LogSumExp().eval(), (torch.randn(3, 8),), str(path), dynamo=False,
                          input_names=["x"])
    assert main(["onnx", str(path.parent), "--out", str(tmp_path / "out"), "--report",
                 str(tmp_path / "batch.html")]) == 0
    page = (tmp_path / "batch.html").read_text(encoding="utf-8")
    assert page.count("<section>") == 1 and "log-sum-exp-fuse" in page and "data:image/png" in page
    tags = Tags()
    tags.feed(page)  # well formed: every element closed, the pictures inline
    assert not tags.open and tags.headings[-2:] == ["programs before and after", "the e-graph"]
    assert tags.count["svg"] == 2 and "cluster_before" in page and pictures.CHOSEN in page
    assert "src=" not in page.replace("src='data:", "")  # self-contained: nothing beside it
    assert main(["onnx", str(path.parent), "--out", str(tmp_path / "out"), "--force", "--report",
                 str(tmp_path / "batch.json")]) == 0
    record = json.loads((tmp_path / "batch.json").read_text())["models"][0]
    assert record["rewrites"] == {"log-sum-exp-fuse": 1}
    assert [r[1] for r in explore(str(path)).derivation().rows] == ["log-sum-exp-fuse"]
