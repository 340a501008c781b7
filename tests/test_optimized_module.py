"""``saturate_and_extract(module)`` is an nn.Module, as torch.compile's result is: training mode,
moves, parameters, checkpoints and attributes are the original's; calls run its plans."""
import warnings

import pytest
import torch

import egraph_opt
from egraph_opt import saturate_and_extract


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)
        self.temperature = 2.0

    def forward(self, x):
        return torch.log(torch.softmax(self.drop(self.proj(x)) / self.temperature, -1))


def test_the_wrapper_is_the_original_to_everything_but_its_calls():
    torch.manual_seed(0)
    head = Head()
    fast = saturate_and_extract(head, profile_budget=0)
    assert isinstance(fast, torch.nn.Module)
    assert fast.eval() is fast and not head.training and not fast.training  # dropout off in both
    x = torch.randn(4, 8)
    torch.testing.assert_close(fast(x), torch.log_softmax(head.proj(x) / 2, -1))
    assert "log-softmax-fuse" in str(fast.report) and fast.egraph is not None and len(fast.plans) == 1
    assert "log_softmax" in str(egraph_opt.explore(fast))
    fast.train()
    assert head.training and fast.training

    assert [n for n, _ in fast.named_parameters()] == ["proj.weight", "proj.bias"]
    assert all(a is b for a, b in zip(fast.parameters(), head.parameters()))
    assert list(fast.state_dict()) == list(head.state_dict())  # checkpoints load into either
    zeros = {k: torch.zeros_like(v) for k, v in head.state_dict().items()}
    fast.load_state_dict(zeros)
    assert not head.proj.weight.any()
    nested = torch.nn.Sequential(fast)  # a parent sees the original's names, both ways
    nested.load_state_dict({f"0.{k}": torch.ones_like(v) for k, v in zeros.items()})
    assert list(nested.state_dict()) == ["0.proj.weight", "0.proj.bias"] and head.proj.bias.eq(1).all()

    assert fast.temperature == 2.0 and fast.proj is head.proj
    fast.temperature = 4.0  # the original's attribute: its code reads it, and it keys the plans
    assert head.temperature == 4.0
    fast.eval()
    torch.testing.assert_close(fast(x), torch.log_softmax(head.proj(x) / 4, -1))
    assert fast.to(torch.float64) is fast and head.proj.weight.dtype == torch.float64
    torch.testing.assert_close(fast(x.double()), torch.log_softmax(head.proj(x.double()) / 4, -1))
    assert len(fast.plans) == 3  # per temperature and dtype, keyed as before


class Decorated(Head):
    @saturate_and_extract(profile_budget=0)
    def forward(self, x):
        return torch.log(torch.softmax(self.proj(x) / self.temperature, -1))


def test_a_decorated_method_warns_of_nothing():
    """Its tensors are lifted into plain attributes, which torch.fx warns of ("Attempted to insert a
    get_attr Node with no underlying reference") though they are there."""
    m, x = Decorated(), torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = m(x)
    assert [str(w.message) for w in caught] == []
    torch.testing.assert_close(out, torch.log_softmax(m.proj(x) / 2, -1))
    assert m.forward.report.optimized


@pytest.mark.parametrize("decorated", ["the module", "its forward"])
def test_a_copy_or_a_pickle_of_the_wrapper_is_the_originals_decorated_anew(decorated):
    """``copy.deepcopy`` (an EMA model) and ``torch.save`` of the whole wrapper, or of a module whose forward is
    decorated, raised from deep inside (a sqlite connection, a weak dictionary; a copied forward walked its half-made
    module): each is now the original's copy, decorated with the same options, its plans made again on its first
    call, its weights its own."""
    import copy
    import io
    torch.manual_seed(0)
    head = Head().eval()
    options = dict(profile_budget=0, objective="stability")
    if decorated == "its forward":
        head.forward = saturate_and_extract(head.forward, **options)
    fast = head if decorated == "its forward" else saturate_and_extract(head, **options)
    x = torch.randn(4, 8)
    with torch.no_grad():
        fast(x)
        buffer = io.BytesIO()
        torch.save(fast, buffer)
        buffer.seek(0)
        for twin in (copy.deepcopy(fast), torch.load(buffer, weights_only=False)):
            plans = twin.forward
            assert isinstance(twin, type(fast)) and plans._options == fast.forward._options and not plans.plans
            torch.testing.assert_close(twin(x), fast(x))
            assert plans.report.optimized and plans.report.signature == fast.forward.report.signature
            twin.proj.weight.mul_(2)
            assert not torch.equal(twin.proj.weight, head.proj.weight)
            torch.testing.assert_close(twin(x), plans.fn(x))
            assert decorated == "the module" or plans.fn.__self__ is twin


def test_parameters_swapped_in_by_functional_call_are_the_ones_a_call_computes_with():
    """torch.func.functional_call puts tensors into a module's parameter and buffer tables directly (no registration
    hook): the key held those tables' identities only as walked (and its generated check consumed a zip once, so no
    table check ran), and a plan with a batch norm folded into its convolution computed with the old weights."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
    fast = saturate_and_extract(m, profile_budget=0)
    x = torch.randn(2, 3, 8, 8)
    swapped = {k: v * 1.5 for k, v in m.state_dict().items()}
    with torch.no_grad():
        fast(x), fast(x)
        assert fast.report.optimized
        torch.testing.assert_close(torch.func.functional_call(fast, swapped, (x,)),
                                   torch.func.functional_call(m, swapped, (x,)))
        torch.testing.assert_close(fast(x), m(x))
