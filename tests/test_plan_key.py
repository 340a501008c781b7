"""The plan key (``drivers/plan_key.py``) reads only what can change a traced program's meaning:
it re-walks the program's modules only when one of them is rebound, and reads the attributes
that the code a forward runs names (its helpers and properties included), not those of methods
a forward never runs."""
import functools

import pytest
import torch
import torch.nn as nn

import egraph_opt.drivers.plan_key as plan_key
from egraph_opt import saturate_and_extract

pytestmark = pytest.mark.filterwarnings("ignore:egraph-opt")


class _Sliced(nn.Module):
    """Slices its ModuleList per call, as Hugging Face decoders do: torch registers the layers
    into a new ModuleList each time."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.depth = 2

    def forward(self, x):
        for layer in self.layers[:self.depth]:
            x = torch.exp(layer(x))
        return x


def _walks(monkeypatch) -> list:
    walked = []
    holders = plan_key.holders
    monkeypatch.setattr(plan_key, "holders", lambda fn: walked.append(fn) or holders(fn))
    return walked


def _walked_only_once_rebound(m: nn.Module, rebind, monkeypatch) -> None:
    """``m`` decorated: calls beside eager's walk none of its modules again, and the first after ``rebind(m)`` does."""
    g = saturate_and_extract(m, profile_budget=0)
    x = torch.randn(2, 4)
    with torch.no_grad():
        g(x)
        walked = _walks(monkeypatch)
        for _ in range(3):
            torch.testing.assert_close(g(x), m(x))
        assert walked == []
        rebind(m)
        torch.testing.assert_close(g(x), m(x))
    assert walked, "a rebinding left the key as it was"
    assert g.report.optimized


def test_a_forward_that_slices_a_module_list_is_keyed_without_walking_its_modules_again(monkeypatch):
    _walked_only_once_rebound(_Sliced().eval(), lambda m: m.layers.__setitem__(1, nn.Linear(4, 4)), monkeypatch)


class _Recast(nn.Module):
    """Its block re-assigns its buffer cast to the input's dtype on every call, as CTRL's ``self.pos_encoding =
    self.pos_encoding.to(device, dtype)`` does: the same object, registered again."""

    def __init__(self):
        super().__init__()
        self.block = nn.Module()
        self.block.register_buffer("table", torch.randn(4))

    def forward(self, x):
        self.block.table = self.block.table.to(device=x.device, dtype=x.dtype)
        return torch.exp(x) * self.block.table


def test_a_buffer_registered_again_as_itself_walks_nothing_and_a_new_one_is_read(monkeypatch):
    """Eager calls between the plan's (a fallen-back plan's original, a user comparing) re-registered the buffer, and
    each next call walked every module of the program again: CTRL's calls ran at 0.2x of eager's. (fx's trace of such
    a forward left a Proxy in the buffer, which the plan then read: it ran untouched.)"""
    _walked_only_once_rebound(_Recast().eval(), lambda m: setattr(m.block, "table", torch.full((4,), 3.0)), monkeypatch)


def test_a_forward_without_state_to_read_is_keyed_once(monkeypatch):
    g = saturate_and_extract(lambda x: torch.log(1 + torch.exp(x)), profile_budget=0)
    x = torch.randn(8)
    g(x)
    walked = _walks(monkeypatch)
    unrelated = nn.Linear(2, 2)
    unrelated.weight = nn.Parameter(torch.randn(2, 2))  # registered into a module no program reads
    for _ in range(3):
        g(x)
    assert walked == [] and len(g.plans) == 1


class _Helped(nn.Module):
    """Reads ``scale`` through a helper method and ``shift`` through a property; ``unused`` only
    in a method its forward never calls."""

    def __init__(self):
        super().__init__()
        self.scale, self._shift, self.unused = 2.0, 1.0, 3.0

    @property
    def shift(self):
        return self._shift

    def scaled(self, x):
        return x * self.scale

    def forward(self, x):
        return torch.log(1 + torch.exp(self.scaled(x))) + self.shift

    def never_run(self, x):
        return x * self.unused


@pytest.mark.parametrize("attribute,new_plan", [("scale", True), ("_shift", True), ("unused", False)])
def test_attributes_a_forward_reaches_key_its_plan_and_others_do_not(attribute, new_plan):
    m = _Helped()
    g = saturate_and_extract(m, profile_budget=0)
    x = torch.randn(8)
    g(x)
    setattr(m, attribute, 0.5)
    torch.testing.assert_close(g(x), m(x))
    assert len(g.plans) == (2 if new_plan else 1)


def _decorated(forward):
    @functools.wraps(forward)
    def wrapper(self, *args):
        return forward(self, *args)
    return wrapper


class _Decorated(nn.Module):
    """A decorated forward (Hugging Face's are): the names its own code reads count."""

    def __init__(self):
        super().__init__()
        self.scale = 2.0

    @_decorated
    def forward(self, x):
        return torch.exp(x * self.scale)


def test_a_decorated_forward_is_keyed_by_what_the_function_inside_reads():
    m = _Decorated()
    g = saturate_and_extract(m, profile_budget=0)
    x = torch.randn(8)
    g(x)
    m.scale = 0.5
    torch.testing.assert_close(g(x), m(x))
    assert len(g.plans) == 2




class _Config:
    def __init__(self):
        self.scale = 2.0


class _Gain(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = 3.0

    def forward(self, x):
        return x * (self.gain if self.training else 1.5)


class _Reads(nn.Module):
    """Reads a config's number, a submodule's attribute and training flag, a parameter and a class
    attribute (which an instance's attribute may shadow)."""
    OFFSET = 0.5

    def __init__(self):
        super().__init__()
        self.cfg, self.inner, self.weight = _Config(), _Gain(), nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.exp(self.inner(x) * self.cfg.scale) * self.weight + self.OFFSET


def _change(m: _Reads, what: str) -> None:
    if what == "config":
        m.cfg.scale = 0.5
    elif what == "submodule":
        m.inner.gain = 0.25
    elif what == "training":
        m.inner.train()
    elif what == "shadowed":  # the class's number is read no more: checked once the instance's dict changed
        m.OFFSET = 2.0
    else:
        m.weight = nn.Parameter(torch.randn(4))


@pytest.mark.parametrize("what", ["config", "submodule", "training", "shadowed", "parameter"])
def test_state_changed_after_many_calls_gets_a_plan_of_its_own(what):
    """The key reads what a dict holds again only once the dict changed (its version): state set
    after many calls of one plan still keys a plan of its own, and an equal number does not."""
    m = _Reads().eval()
    m.inner.gain = 2.0 if what == "training" else 3.0  # training: 1.5 in place of 3.0
    g = saturate_and_extract(m, profile_budget=0)
    x = torch.randn(4)
    with torch.no_grad():
        for _ in range(20):
            torch.testing.assert_close(g(x), m(x))
        m.cfg.scale = float("2.0")  # rebound to an equal number: the same plan
        g(x)
        assert len(g.plans) == 1
        _change(m, what)
        for _ in range(3):
            torch.testing.assert_close(g(x), m(x))
        assert len(g.plans) == 2


SHIFT = 1.0  # a module-level global a submodule's forward reads


class _Shifted(nn.Module):
    def forward(self, x):
        return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True) + SHIFT


@pytest.mark.parametrize("nested", [False, True], ids=["forward", "submodule"])
def test_a_global_a_forward_reads_keys_the_plan(nested, monkeypatch):
    """A module's code is its forwards: a global read there (and in a submodule's forward) is read
    by the key as a function's globals are, so rebinding it gives a plan of its own."""
    m = nn.Sequential(nn.Identity(), _Shifted()) if nested else _Shifted()
    g = saturate_and_extract(m, profile_budget=0)
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(g(x), m(x))
        monkeypatch.setattr(f"{__name__}.SHIFT", 5.0)
        torch.testing.assert_close(g(x), m(x))
    assert len(g.plans) == 2


def test_a_call_laid_out_otherwise_than_the_last_runs_a_plan_of_its_own_shapes():
    """A call laid out otherwise than the last first tries the plan of the call that followed that
    one last (a generation's prefill after its last decode step); that plan's own checks decide, so
    a call of other shapes or constants gets a plan of its own."""
    g = saturate_and_extract(lambda x, scale=1.0: torch.exp(x) * scale, profile_budget=0)
    a, b, c = torch.randn(4), torch.randn(2, 3), torch.randn(5)
    for x, kwargs in [(a, {}), (b, {"scale": 2.0}), (a, {}), (b, {"scale": 2.0}), (a, {}),
                      (c, {"scale": 2.0}), (a, {}), (b, {"scale": 3.0})]:
        torch.testing.assert_close(g(x, **kwargs), torch.exp(x) * kwargs.get("scale", 1.0))
    assert len(g.plans) == 4


def test_a_walk_made_again_keys_the_same_state_with_the_same_objects():
    """Every new plan walks the program again (``settle``), and a plan keeps the state key it was
    made with: a decode step's plans, one per size, were each made at another walk. An equal state
    must come back as the same objects, so the fast path compares it by identity, not value by
    value (a Hugging Face model's state holds a few hundred)."""
    m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Dropout(0.1)).eval()
    state = plan_key.StateKey(m)
    first = state.key()
    state.settle(state.snapshot())
    again = state.key()
    assert again == first and all(a is b for a, b in zip(again, first)), (first, again)


def test_walks_made_anew_on_every_call_are_remembered_boundedly_and_never_share_a_key(monkeypatch):
    """A hook registered anew on every call makes every call walk anew: the walks remembered are
    bounded, and a walk forgotten and made again never gets the int of another (which would key
    another state's plan)."""
    monkeypatch.setattr(plan_key, "WALKS", 4)
    m = nn.Sequential(nn.Linear(4, 4)).eval()
    state, keys = plan_key.StateKey(m), []
    for _ in range(10):
        handle = m.register_forward_hook(lambda *a: None)
        state.settle(state.snapshot())
        keys.append(state.key())
        handle.remove()
    assert len(plan_key._TOKENS) <= 4
    assert len({k[0] for k in keys}) == 10, keys
