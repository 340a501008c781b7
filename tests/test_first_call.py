"""The first call is bounded: no walk of the whole program per node."""
import torch
from torch import nn

import egraph_opt.lang.term as term
from egraph_opt import saturate_and_extract


class Block(nn.Module):
    """A pre-norm block with an op the Term language does not hold (cumsum: an opaque call)."""

    def __init__(self, c: int):
        super().__init__()
        self.ln, self.up, self.down = nn.LayerNorm(c), nn.Linear(c, 2 * c), nn.Linear(2 * c, c)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln(x)))) + x.cumsum(-1) * 1e-3


def _visited(blocks: int, monkeypatch) -> int:
    """Terms visited by every walk (``term.topological``) of one first call."""
    seen = []
    walk = term.topological
    monkeypatch.setattr(term, "topological", lambda *a: seen.append(len(out := walk(*a))) or out)
    torch.manual_seed(0)
    f = saturate_and_extract(nn.Sequential(*[Block(8) for _ in range(blocks)]).eval(), profile_db=False,
                             profile_budget=0)
    with torch.no_grad():
        f(torch.randn(2, 4, 8))
    assert f.report.optimized and f.report.kernels["torch.linear_act"] == blocks, f.report
    monkeypatch.setattr(term, "topological", walk)
    return sum(seen)


def test_the_walks_of_a_first_call_grow_linearly_with_depth(monkeypatch):
    """build_module walked each term's whole past (5,641 walks at 48 blocks), and the replay of the
    rewrites each subterm's at every one of its exponentially many locations: 4x the blocks visited
    900x the terms. Linear now: 4x the blocks, about 4x the terms visited (quadratic: 16x)."""
    few, many = _visited(6, monkeypatch), _visited(24, monkeypatch)
    assert many <= 5 * few, (few, many)
