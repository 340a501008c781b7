"""Repeated blocks are optimized once, as a template, and instantiated per block."""
import math

import pytest
import torch
import torch.nn as nn

from egraph_opt import capture, optimize, saturate_and_extract
from egraph_opt.lang.term import postorder
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


def plain_stack(n: int, hidden=None):
    """The stack as a plain function closing over a list of parameter dicts (no module items);
    ``hidden``: each block's MLP width (NaiveBlock's is 128)."""
    weights = []
    for width in hidden or [128] * n:
        p = dict(NaiveBlock().named_parameters())
        p.update({"fc.weight": torch.randn(width, 32), "fc.bias": torch.randn(width),
                  "out.weight": torch.randn(32, width) / width})
        weights.append(p)
    mask = torch.ones(16, 16, dtype=torch.bool).triu(1)

    def norm(x, w, b):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-5) * w + b

    def forward(x):
        for p in weights:
            q, k, v = (norm(x, p["ln_w"], p["ln_b"]) @ p["qkv.weight"].T + p["qkv.bias"]).split(32, -1)
            s = (q @ k.transpose(-2, -1) / math.sqrt(32)).masked_fill(mask, float("-inf"))
            x = x + torch.softmax(s, -1) @ v @ p["proj.weight"].T + p["proj.bias"]
            h = norm(x, p["ln_w"], p["ln_b"]) @ p["fc.weight"].T + p["fc.bias"]
            x = x + torch.relu(h) @ p["out.weight"].T + p["out.bias"]
        return x
    return forward


def unrolled_stack(x, w1, w2, w3):
    """Three copies of one block written out by hand, weights as arguments."""
    for w in (w1, w2, w3):
        h = torch.softmax(x @ w, -1)
        x = x + torch.exp(h - h.amax(-1, keepdim=True)).sum(-1, keepdim=True) * torch.tanh(x) / 3
    return x


@pytest.mark.parametrize("build, args", [
    (lambda: plain_stack(3), (torch.randn(2, 16, 32),)),
    (lambda: unrolled_stack, (torch.randn(4, 8),) + tuple(torch.randn(8, 8) for _ in range(3))),
], ids=["closure-over-dicts", "unrolled-loop"])
def test_repeated_blocks_are_found_by_structure_and_match_the_original(build, args):
    fn = build()
    program, _ = capture(fn, args)
    (group,) = templates.find(program)
    assert len(group) >= 2 and all(inst.scope.startswith("repeat") for inst in group)
    assert optimize(program).ops_after == optimize(program, templates=False).ops_after
    f = saturate_and_extract(fn)
    torch.testing.assert_close(f(*args), fn(*args), rtol=1e-4, atol=1e-4)
    assert f.report.validation.passed


def test_blocks_of_different_shapes_are_not_one_template_when_found_by_structure():
    program, _ = capture(plain_stack(2, hidden=[128, 64]), (torch.randn(1, 16, 32),))
    assert templates.find(program) == []
    program, _ = capture(plain_stack(2, hidden=[64, 64]), (torch.randn(1, 16, 32),))
    assert len(templates.find(program)) == 1


def test_a_weight_shared_by_every_block_stays_an_argument_of_the_template():
    """The causal mask is read by every block: not one block's own parameter."""
    program, _ = capture(plain_stack(3), (torch.randn(1, 16, 32),))
    (group,) = templates.find(program)
    shared = [a for a in group[0].args if a.op == "param"]
    assert [a.attrs[1:] for a in shared] == [("16,16", "bool")]
    assert all(set(inst.params.values()).isdisjoint(other.params.values())
               for inst in group for other in group if other is not inst)


def test_hugging_face_export_graph_blocks_share_one_template():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=50, n_positions=16,
                                     use_cache=False)
    model = transformers.GPT2Model(config).eval()
    program, _ = capture(model, (torch.randint(0, 50, (1, 8)),))
    (group,) = templates.find(program)
    assert len(group) == 3


def test_the_join_precision_phase_stays_bounded():
    """Half-precision blocks as templates leave casts between them: the phase that joins them
    (precision rules alone) saturates in a few iterations, in a small e-graph."""
    model = Stack(2).eval().half()
    x = torch.randn(1, 16, 32).half()
    program, _ = capture(model, (x,))
    result = optimize(program)
    (join,) = [s for s in result.saturation if s.phase == "join_precision"]
    assert join.stop == "saturated" and join.iterations <= 10 and join.enodes < 2000


class Between(nn.Module):
    """Repeated blocks with a computation of the program's own between them that reads one block's output and feeds
    both the next block and the output (MobileViT's convolutions between its transformer blocks)."""

    def __init__(self):
        super().__init__()
        self.h = nn.ModuleList([NaiveBlock(32) for _ in range(3)])
        self.mix = nn.ModuleList([nn.Linear(32, 32) for _ in range(2)])

    def forward(self, x):
        between = []
        for i, block in enumerate(self.h):
            x = block(x)
            if i < 2:
                x = torch.tanh(self.mix[i](x)) * 2
                between.append(x)
        return x, *between


def test_what_lies_between_instances_is_built_once_where_an_instance_and_the_output_read_it():
    """Filling the instances' outputs into the outer program shares what it builds: each computation between blocks
    is one term, read by the next instance and by the output (it was built once for each: a MobileViT's plan ran 24
    of its convolutions twice and measured 0.84x eager)."""
    from egraph_opt.lang.pattern import structural_ids
    from egraph_opt.lang.term import postorder
    model = Between().eval()
    program, _ = capture(model, (torch.randn(2, 16, 32),))
    result = optimize(program)
    roots = result.program.roots()
    assert any("template of h.0 x3" in s.phase for s in result.saturation)
    assert len(postorder(roots)) == len(set(structural_ids(roots).values()))
    f = saturate_and_extract(model)
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-4)


class Positioned(nn.Module):
    """A block that computes a positional term from the stack's input (as some models recompute their rotary tables
    in every layer)."""
    def __init__(self):
        super().__init__()
        self.block = NaiveBlock(32)

    def forward(self, x, pos):
        return self.block(x + torch.sin(pos * 3.0))


class PositionedStack(Stack):
    def __init__(self, n: int):
        super().__init__(0)
        self.h = nn.ModuleList([Positioned() for _ in range(n)])

    def forward(self, x, pos):
        for block in self.h:
            x = block(x, pos)
        return x


def test_a_value_every_block_computes_is_one_term_read_by_one_template():
    """Copies of one value in two templates would be optimized apart and could round apart; as one term (the e-graph
    holds them so), it is computed outside the blocks, which still share one template."""
    model, args = PositionedStack(3).eval(), (torch.randn(1, 16, 32), torch.randn(16, 32))
    program, _ = capture(model, args)
    sines = lambda p: sum(t.op == "sin" for t in postorder(p.roots()))  # noqa: E731
    one = templates.shared(program)
    assert sines(program) == 3 and sines(one) == 1
    (group,) = templates.find(one)
    assert len(group) == 3 and all(any(a.op == "sin" for a in inst.args) for inst in group)
    f = saturate_and_extract(model)
    with torch.no_grad():
        torch.testing.assert_close(f(*args), model(*args), rtol=1e-4, atol=1e-4)
    assert f.report.validation.passed and any("template of h.0 x3" in line for line in f.report.saturation)
