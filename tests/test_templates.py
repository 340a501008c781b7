"""Repeated blocks are optimized once, as a template, and instantiated per block."""
import torch
import torch.nn as nn

from egraph_opt import capture, optimize, saturate_and_extract
from egraph_opt.optimization import templates
from test_fusion import NaiveBlock


class Stack(nn.Module):
    def __init__(self, n: int, widths=None):
        super().__init__()
        self.h = nn.ModuleList([NaiveBlock(c) for c in (widths or [32] * n)])

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return x


def test_identical_blocks_share_one_template_and_match_the_original():
    model = Stack(3).eval()
    f = saturate_and_extract(model)
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-4)
    assert f.report.validation.passed
    assert any("template of h.0 x3" in line for line in f.report.saturation)
    after = f.report.ops_after
    assert after.get("layer_norm") == 6 and after.get("sdpa_masked") == 3
    assert after.get("linear_act") == 3


def test_templates_find_what_whole_program_optimization_finds():
    program, _ = capture(Stack(2).eval(), (torch.randn(1, 16, 32),))
    (group,) = templates.find(program)
    assert [inst.scope for inst in group] == ["h.0", "h.1"]
    with_templates, without = optimize(program), optimize(program, templates=False)
    assert with_templates.ops_after == without.ops_after


def test_blocks_of_different_shapes_are_not_one_template():
    program, _ = capture(Stack(2).eval(), (torch.randn(1, 16, 32),))
    assert len(templates.find(program)) == 1
    mixed = Stack(0)
    mixed.h = nn.ModuleList([NaiveBlock(32), nn.Sequential(nn.Linear(32, 32))])
    program, _ = capture(mixed.eval(), (torch.randn(1, 16, 32),))
    assert templates.find(program) == []


def test_the_join_precision_phase_stays_bounded():
    """Half-precision blocks as templates leave casts between them: the phase that joins them
    (precision rules alone) saturates in a few iterations, in a small e-graph."""
    model = Stack(2).eval().half()
    x = torch.randn(1, 16, 32).half()
    program, _ = capture(model, (x,))
    result = optimize(program)
    (join,) = [s for s in result.saturation if s.phase == "join_precision"]
    assert join.stop == "saturated" and join.iterations <= 10 and join.enodes < 2000
