"""Ordinary programs that once came back wrong: each result must be the original's, or the
program runs untouched and the report says why."""
import functools
import math
import types

import pytest
import torch
import torch.nn as nn

import egraph_opt.drivers.api as api
from egraph_opt import saturate_and_extract
from egraph_opt.validate import WIDE, compare, wide_reference

pytestmark = pytest.mark.filterwarnings("ignore:egraph-opt")


def _twins(build):
    """Two equal modules: one decorated, one the yardstick."""
    torch.manual_seed(0)
    a = build()
    b = build()
    b.load_state_dict(a.state_dict())
    return saturate_and_extract(a), a, b


def _conv_bn():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())


@pytest.mark.parametrize("mutate", [
    lambda x: x.add_(1),
    lambda x: x.__setitem__(0, 5.0),
    lambda x: torch.exp(x, out=x),
    lambda x: x[1:].mul_(3),  # through a view
])
def test_a_program_that_mutates_its_argument_writes_it_back_after_all_it_reads(mutate):
    """torch.export's functional form computes the written value; the plan writes it into the caller's tensor after
    all else, so what the original read before its write (``before``) reads the old values, as eager."""
    def f(x):
        before = torch.log(1 + x.abs())
        mutate(x)
        return before + torch.log(1 + x.abs())

    g = saturate_and_extract(f)
    for _ in range(3):  # a second call once returned 2x and left x alone
        x = torch.randn(3)
        y = x.clone()
        torch.testing.assert_close(g(x), f(y))
        torch.testing.assert_close(x, y)
    assert g.report.optimized and "log1p" in g.report.ops_after, g.report


@pytest.mark.parametrize("write", [
    lambda y: y.add_(10),
    lambda y: y.__setitem__((slice(None), 0), 5.0),  # y[:, 0] = 5
    lambda y: y[1:].mul_(3),  # through a view
    lambda y: y[:, 1:].copy_(y[:, :-1] * 2),
    lambda y: y.index_put_((torch.tensor([0, 2]),), torch.tensor(-1.0)),
])
def test_an_intermediate_written_in_place_and_read_again_is_optimized_in_its_functional_form(write):
    """A program writing into a value it computed (BEiT's index tables built by slice writes) is traced again by
    torch.export in its functional form (a select_scatter for ``y[:, 0] = 5``): pure, so optimized, as eager computes."""
    def f(x):
        y = x * 2
        z = y + 1
        write(y)
        return torch.log(1 + (y + z).abs())

    g = saturate_and_extract(f)
    for _ in range(2):
        x = torch.randn(4, 5)
        torch.testing.assert_close(g(x), f(x))
    assert g.report.optimized and "log1p" in g.report.ops_after, g.report


def test_a_program_writing_its_argument_and_a_value_of_its_own_is_optimized_and_writes_back():
    def f(x):
        y = x * 2
        z = y + 1
        y.add_(10)
        x.mul_(2)
        return torch.log(1 + (y + z).abs())

    g = saturate_and_extract(f)
    for _ in range(2):
        x = torch.randn(3)
        y = x.clone()
        torch.testing.assert_close(g(x), f(y))
        torch.testing.assert_close(x, y)
    assert g.report.optimized and "log1p" in g.report.ops_after, g.report


def test_a_call_whose_written_argument_shares_memory_with_another_runs_the_original():
    """``f(a, a)``: the original's read of y sees its write of x; the plan, traced with them apart, would read the old
    values. A call where a written argument shares memory with another runs the original; apart, the plan."""
    def f(x, y):
        x.add_(1)
        return torch.log(1 + y.abs())

    g = saturate_and_extract(f)
    for aliased in (False, True, False, True):
        a, b = torch.randn(4), torch.randn(4)
        mine = a.clone()
        b, theirs = (a, mine) if aliased else (b, b.clone())
        torch.testing.assert_close(g(a, b), f(mine, theirs))
        torch.testing.assert_close(a, mine)
    assert g.report.optimized and "log1p" in g.report.ops_after, g.report


def test_a_plan_writing_its_argument_back_runs_once_where_its_guards_assumed_wrong():
    """A plan of many guarded attentions speculates (each guard assumes finite scores, read at once after); where the
    scores overflow it ran again, and wrote the caller's counter twice."""
    def f(q, k, v, n):
        s = q.new_zeros(())
        for i in range(9):
            s = s + (torch.softmax((q * (i + 1)) @ k.transpose(-1, -2) / 4.0, -1) @ v).sum()
        n.add_(1)
        return s

    g = saturate_and_extract(f, profile_budget=0)
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 8, 16).unbind()
    for scale in (1.0, 1.0, 1e19, 1.0):  # 1e19: every score overflows
        n, m = torch.zeros(()), torch.zeros(())
        torch.testing.assert_close(g(q * scale, k * scale, v, n), f(q * scale, k * scale, v, m), equal_nan=True)
        assert n == m == 1
    assert g.report.optimized and g.report.ops_after.get("sdpa") == 9, g.report


def test_a_program_updating_a_buffer_of_its_own_runs_untouched():
    """What no write-back expresses stays the original's: a buffer the program updates (state, not an argument)."""
    m = nn.Module()
    m.register_buffer("count", torch.zeros(()))
    m.forward = lambda x: (m.count.add_(1), x * m.count)[1]
    g = saturate_and_extract(m)
    for n in (1, 2):
        torch.testing.assert_close(g(torch.ones(2)), torch.full((2,), float(n)))
    assert "'count'" in g.report.fallback, g.report.fallback


def test_an_in_place_activation_nobody_reads_again_is_still_optimized():
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 2)).eval()
    g = saturate_and_extract(m)
    x = torch.randn(3, 4)
    torch.testing.assert_close(g(x), m(x))
    assert g.report.optimized


def test_switching_eval_to_train_gets_a_plan_of_its_own():
    g, mine, twin = _twins(_conv_bn)
    x = torch.randn(2, 3, 8, 8)
    mine.eval(), twin.eval()
    torch.testing.assert_close(g(x), twin(x))
    mine.train(), twin.train()
    for _ in range(2):  # batch statistics, and running statistics updated once per call
        torch.testing.assert_close(g(x), twin(x))
        torch.testing.assert_close(mine[1].running_mean, twin[1].running_mean)
    assert "train-mode batch norm" in g.report.fallback
    mine.eval(), twin.eval()
    torch.testing.assert_close(g(x), twin(x))  # the eval plan again, with the updated statistics


@pytest.mark.parametrize("rebind", [
    lambda m: setattr(m[0], "weight", nn.Parameter(torch.randn(4, 3, 3, 3))),
    lambda m: setattr(m[1], "running_mean", torch.randn(4)),
    lambda m: m.load_state_dict(_conv_bn().state_dict(), assign=True),
    lambda m: m[0].weight.data.mul_(-1),  # in place: the same tensor, a new version
    lambda m: setattr(m[0].weight, "data", torch.randn(4, 3, 3, 3)),  # the same tensor and version, other storage
])
def test_rebound_or_reloaded_weights_are_used(rebind):
    g, mine, twin = _twins(_conv_bn)
    mine.eval(), twin.eval()
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(g(x), twin(x))
    rebind(mine)
    twin.load_state_dict(mine.state_dict())
    torch.testing.assert_close(g(x), twin(x))


def test_a_closure_over_a_list_of_weights_sees_an_item_rebound():
    weights = [torch.randn(4, 4)]
    g = saturate_and_extract(lambda x: torch.softmax(x @ weights[0], -1))
    x = torch.randn(2, 4)
    g(x)
    weights[0] = torch.randn(4, 4)
    torch.testing.assert_close(g(x), torch.softmax(x @ weights[0], -1))


TEMPERATURE = 2.0  # a global the next test's programs read, and change


def _tempered_softplus(x, t):  # softplus(x / t), spelled as a rule rewrites it
    return torch.log(1 + torch.exp(x / t))


def _at_global_temperature(x):
    return _tempered_softplus(x, TEMPERATURE)


CONFIG = types.SimpleNamespace(temperature=2.0)  # a config object a program reads a number of


def _at_config_temperature(x):
    return _tempered_softplus(x, CONFIG.temperature)


def _through_a_helper(x):
    return _at_global_temperature(x) * 2.0


class _Tempered(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = 2.0

    def forward(self, x):
        return _tempered_softplus(x, self.temperature)


def _closure():
    temperature = 2.0

    def fn(x):
        return _tempered_softplus(x, temperature)

    def cool():
        nonlocal temperature
        temperature = 0.5
    return fn, cool


def _set_global(value):
    global TEMPERATURE
    TEMPERATURE = value


@pytest.mark.parametrize("where", ["global", "helper's global", "module attribute", "closure cell",
                                   "config object"])
def test_a_python_scalar_the_trace_baked_in_is_part_of_the_key(where):
    """A trace bakes the Python numbers it reads into the program as constants: a global, a
    helper's global, a module's attribute, a closure's cell. Changed after the first call, the
    original computes with the new value, so the plan must too (it ran with the old one)."""
    module = _Tempered()
    closure, cool = _closure()
    fn, change = {"global": (_at_global_temperature, lambda: _set_global(0.5)),
                  "helper's global": (_through_a_helper, lambda: _set_global(0.5)),
                  "module attribute": (module, lambda: setattr(module, "temperature", 0.5)),
                  "closure cell": (closure, cool),
                  "config object": (_at_config_temperature, lambda: setattr(CONFIG, "temperature", 0.5))}[where]
    g = saturate_and_extract(fn, objective="stability")
    x = torch.randn(4, 8)
    try:
        torch.testing.assert_close(g(x), fn(x))
        change()
        torch.testing.assert_close(g(x), fn(x))
        assert len(g.plans) == 2
    finally:
        _set_global(2.0)
        CONFIG.temperature = 2.0


WEIGHT = torch.randn(8, 8)  # globals the next test's programs read, rebind or write
SCALE = torch.randn(8)
ACTIVATION = torch.tanh
LAYER = nn.Linear(8, 8)
WEIGHTS = [torch.randn(8, 8)]
HOLDER = types.SimpleNamespace(weight=torch.randn(8, 8), act=torch.tanh,
                               nested=types.SimpleNamespace(scale=2.0), numbers={"scale": 2.0})
NUMBERS = [2.0]


class _Settings:
    """Class attributes a program reads (``_Settings.SCALE``), and a plain object's method."""
    SCALE = 2.0

    def __init__(self):
        self.weight = torch.randn(8, 8)

    def score(self, x):
        return torch.softmax(x @ self.weight * self.SCALE, -1)


class _ClassScaled(nn.Module):
    SCALE = 2.0

    def forward(self, x):
        return torch.log(1 + torch.exp(x * self.SCALE))


class _Attributes(nn.Module):
    """A plain tensor and a function as attributes: neither a parameter, a buffer nor a submodule."""

    def __init__(self):
        super().__init__()
        self.scale, self.act = torch.tensor(2.0), torch.tanh

    def forward(self, x):
        return torch.softmax(self.act(x) * self.scale, -1)


def _rebinding_cases():
    """name -> (program, what changes after its first call)."""
    g = globals()

    def rebind(name, value):
        return lambda: g.__setitem__(name, value)

    def closure():
        scale = torch.tensor(2.0)

        def fn(x):
            return torch.log(1 + torch.exp(x * scale))

        def change():
            nonlocal scale
            scale = torch.tensor(-5.0)
        return fn, change

    def with_default(x, w=torch.randn(8, 8), t=2.0):
        return torch.softmax(x @ w / t, -1)

    module, settings, scaled = _Attributes(), _Settings(), _ClassScaled()
    hooked, unhooked = (nn.Sequential(nn.Linear(8, 8), nn.Softplus()) for _ in range(2))
    handle = unhooked[0].register_forward_hook(lambda m, i, out: out * 2)
    return {
        "global tensor": (lambda x: torch.softmax(x @ WEIGHT, -1), rebind("WEIGHT", torch.randn(8, 8))),
        "global tensor written, a value of it baked in": (
            lambda x: torch.softmax(x * (SCALE * 2), -1), lambda: SCALE.mul_(3)),
        "global module": (lambda x: torch.softmax(LAYER(x), -1), rebind("LAYER", nn.Linear(8, 8))),
        "global function": (lambda x: torch.softmax(ACTIVATION(x) * 3, -1), rebind("ACTIVATION", torch.sigmoid)),
        "global list": (lambda x: torch.softmax(x @ WEIGHTS[0], -1), rebind("WEIGHTS", [torch.randn(8, 8)])),
        "config object's tensor": (lambda x: torch.softmax(x @ HOLDER.weight, -1),
                                   lambda: setattr(HOLDER, "weight", torch.randn(8, 8))),
        "config object's function": (lambda x: torch.softmax(HOLDER.act(x) * 3, -1),
                                     lambda: setattr(HOLDER, "act", torch.sigmoid)),
        "closure cell's tensor": closure(),
        "tensor default": (with_default, lambda: setattr(with_default, "__defaults__", (torch.randn(8, 8), 2.0))),
        "number default": (with_default, lambda: setattr(with_default, "__defaults__", (with_default.__defaults__[0], 0.25))),
        "module's tensor attribute": (module, lambda: setattr(module, "scale", torch.tensor(0.1))),
        "module's function attribute": (module, lambda: setattr(module, "act", torch.sigmoid)),
        "global list of numbers written": (lambda x: torch.log(1 + torch.exp(x * NUMBERS[0])),
                                           lambda: NUMBERS.__setitem__(0, -3.0)),
        "config object's dict written": (lambda x: torch.log(1 + torch.exp(x * HOLDER.numbers["scale"])),
                                         lambda: HOLDER.numbers.__setitem__("scale", -3.0)),
        "nested config object": (lambda x: torch.log(1 + torch.exp(x * HOLDER.nested.scale)),
                                 lambda: setattr(HOLDER.nested, "scale", -3.0)),
        "forward hook registered": (hooked, lambda: hooked[0].register_forward_hook(lambda m, i, out: out * 2)),
        "forward pre-hook registered": (hooked, lambda: hooked[0].register_forward_pre_hook(lambda m, i: (i[0] * 3,))),
        "forward hook removed": (unhooked, handle.remove),
        "module class's attribute": (scaled, lambda: setattr(_ClassScaled, "SCALE", -3.0)),
        "module class's attribute shadowed": (scaled, lambda: setattr(scaled, "SCALE", -3.0)),
        "a class's attribute": (lambda x: torch.log(1 + torch.exp(x * _Settings.SCALE)),
                                lambda: setattr(_Settings, "SCALE", -3.0)),
        "plain object's tensor, through its method": (settings.score,
                                                       lambda: setattr(settings, "weight", torch.randn(8, 8))),
    }


@pytest.mark.parametrize("case", list(_rebinding_cases()))
def test_a_rebound_or_written_object_the_trace_read_gets_a_plan_of_its_own(case):
    """The trace holds the tensors, modules and functions a program reads through its globals,
    closure, defaults and attributes, bakes in the numbers and the values it computed from them,
    and runs the hooks: rebound, written or (un)registered after the first call, the program must
    run with the new one (each of these once ran with the old one)."""
    saved = {n: globals()[n] for n in ("WEIGHT", "SCALE", "ACTIVATION", "LAYER", "WEIGHTS")}
    saved_holder, saved_numbers = dict(vars(HOLDER)), list(NUMBERS)
    fn, change = _rebinding_cases()[case]
    g = saturate_and_extract(fn, profile_budget=0)  # not measured: a small program is kept optimized
    x = torch.randn(4, 8)
    try:
        torch.testing.assert_close(g(x), fn(x))
        assert not g.report.fallback
        change()
        torch.testing.assert_close(g(x), fn(x))
    finally:
        globals().update(saved)
        vars(HOLDER).update(saved_holder)
        HOLDER.numbers["scale"], HOLDER.nested.scale, NUMBERS[:] = 2.0, 2.0, saved_numbers
        _Settings.SCALE = _ClassScaled.SCALE = 2.0


def test_a_global_tensor_the_program_holds_is_written_without_a_new_plan():
    """Written in place, a tensor the plan's graph holds itself is read by the plan when it runs:
    the same plan serves (no re-optimization per write, as a training loop would cost)."""
    weight = torch.randn(8, 8)
    g = saturate_and_extract(lambda x: torch.softmax(x @ weight, -1), profile_budget=0)
    x = torch.randn(4, 8)
    g(x)
    weight.mul_(3)
    torch.testing.assert_close(g(x), torch.softmax(x @ weight, -1))
    assert len(g.plans) == 1


class _Recording(nn.Module):
    """Stores what it saw and counts its calls; ``branch``: decides on a value (so it runs untouched)."""

    def __init__(self, branch: bool):
        super().__init__()
        self.branch, self.calls, self.seen, self.stats = branch, 0, None, {"calls": 0}

    def forward(self, x):
        self.calls += 1
        self.stats["calls"] += 1
        self.seen = torch.zeros(1)
        y = torch.log(1 + torch.exp(x))
        return y if not self.branch or bool(x.sum() > -1e30) else x


@pytest.mark.parametrize("branch", [False, True])
def test_state_a_program_writes_itself_does_not_make_a_plan_per_call(branch):
    """A forward that rebinds its own attributes each call runs untouched (a plan would not write
    them), and once: they are its outputs, not what it computes from. Keyed by them, every call of
    the original made a new key and optimized again."""
    module = _Recording(branch)
    g = saturate_and_extract(module, profile_budget=0)
    x = torch.randn(4, 8)
    for _ in range(5):
        torch.testing.assert_close(g(x), torch.log(1 + torch.exp(x)))
    assert len(g.plans) <= 2 and g.report.fallback and module.calls == module.stats["calls"] == 5


def test_the_default_dtype_is_part_of_the_key():
    """A tensor the program makes (torch.arange(4.0)) takes the default dtype of the call."""
    f = lambda x: torch.log(1 + torch.exp(x)) + torch.arange(4.0)  # noqa: E731
    g = saturate_and_extract(f, objective="stability")
    x = torch.randn(4)
    assert g(x).dtype == torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.testing.assert_close(g(x), f(x))
    finally:
        torch.set_default_dtype(previous)


def test_grad_mode_and_requires_grad_are_part_of_the_key():
    g = saturate_and_extract(lambda x: torch.log(1 + torch.exp(x)))
    x = torch.randn(4)
    g(x)
    with torch.no_grad():
        g(x)
    g(x.requires_grad_())
    assert len(g.plans) == 3


@pytest.mark.parametrize("fn,args,kwargs", [
    (torch.exp, (torch.randn(3),), {}),
    (functools.partial(torch.add, alpha=2.0), (torch.randn(3), torch.randn(3)), {}),
])
def test_builtins_and_partials_are_optimized(fn, args, kwargs):
    g = saturate_and_extract(fn)
    torch.testing.assert_close(g(*args, **kwargs), fn(*args, **kwargs))
    assert g.report.optimized


def test_keyword_only_parameters_and_none_defaults():
    def f(x, mask=None, *, scale):
        y = torch.log(1 + x) * scale
        return y if mask is None else y.masked_fill(mask, 0.0)

    g = saturate_and_extract(f, objective="stability")  # log1p whatever latencies other tests recorded
    x = torch.rand(4)
    torch.testing.assert_close(g(x, scale=torch.tensor(2.0)), f(x, scale=torch.tensor(2.0)))
    assert g.report.optimized and "log1p" in g.report.ops_after
    mask = torch.tensor([True, False, True, False])
    torch.testing.assert_close(g(x, mask, scale=torch.tensor(2.0)), f(x, mask, scale=torch.tensor(2.0)))


def test_a_hugging_face_model_decorated_directly_returns_its_model_output():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    g = saturate_and_extract(model)
    ids = torch.randint(0, 50, (2, 8))
    with torch.no_grad():
        out, ref = g(ids, use_cache=False), model(ids, use_cache=False)
        assert type(out) is type(ref) and g.report.optimized
        torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-4)
        cached, ref = g(ids), model(ids)  # a cache object in the output: a pytree of the plan's
        assert g.report.optimized, g.report.fallback
        torch.testing.assert_close(cached.logits, ref.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(cached.past_key_values.layers[0].keys, ref.past_key_values.layers[0].keys)


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(0, 3),
    lambda: torch.randn(3, dtype=torch.complex64),
    lambda: torch.randn(3, device="meta"),
])
def test_empty_complex_and_meta_tensors_never_raise(make):
    f = lambda x: torch.exp(x) * 2  # noqa: E731
    g = saturate_and_extract(f)
    x = make()
    out = g(x)
    if x.device.type != "meta":
        torch.testing.assert_close(out, f(x))


def test_an_unexpected_failure_inside_the_optimizer_runs_the_original(monkeypatch):
    def broken(*args, **kwargs):
        raise IndexError("deep inside")

    monkeypatch.setattr(api, "optimize", broken)
    g = saturate_and_extract(lambda x: torch.exp(x) / torch.exp(x).sum())
    x = torch.randn(4)
    with pytest.warns(UserWarning, match="runs untouched: IndexError: deep inside"):
        torch.testing.assert_close(g(x), torch.exp(x) / torch.exp(x).sum())
    assert not g.report.optimized and "[FALLBACK]" in str(g.report)


def test_validation_leaves_the_callers_random_stream_alone():
    g = saturate_and_extract(lambda x: torch.log(1 + x))
    torch.manual_seed(1)
    g(torch.rand(4))
    after = torch.rand(3)
    torch.manual_seed(1)
    torch.rand(4)
    torch.testing.assert_close(after, torch.rand(3))


# -- the acceptance rule, on candidates that once passed ------------------------------------------
def _folded(x):
    return x * 1e60  # x * 1e30 * 1e30 with its constants folded: inf in float32, 0 * inf = NaN


def _naive_softmax(x):
    return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)


@pytest.mark.parametrize("original,candidate,x", [
    (lambda x: x * 1e30 * 1e30, lambda x: x * torch.tensor(1e60, dtype=torch.float32),
     torch.tensor([0.0, 1.0, -2.0])),
    (lambda x: x / 1e-39, lambda x: x * float(torch.tensor(1 / 1e-39, dtype=torch.float32)),
     torch.tensor([0.0, 1e-3])),
    (lambda x: 1 / (x + 0.0), lambda x: 1 / x, torch.tensor([-0.0, 1.0])),
    (_naive_softmax, lambda x: torch.softmax(x, -1), torch.tensor([math.inf, 1.0, 2.0])),
])
def test_validation_refuses_a_candidate_wrong_where_the_original_is_right(original, candidate, x):
    verdict = compare(original, candidate, (x,))
    assert not verdict.passed, verdict


def test_validation_accepts_a_candidate_closer_to_the_truth_where_the_original_overflows():
    original = lambda x: torch.log(torch.exp(x))  # noqa: E731 - inf at 100 in float32
    verdict = compare(original, lambda x: x.clone(), (torch.tensor([1.0, 100.0]),))
    assert verdict.passed, verdict


def _naive_tanh(x):
    return (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x))  # NaN past 710 in float64


@pytest.mark.skipif(WIDE is None, reason="long double is float64 here")
@pytest.mark.parametrize("candidate,passes", [
    (torch.tanh, True),                                  # the truth, where float64 overflows too
    (lambda x: torch.tanh(x) * 0.5, False),              # wrong everywhere
    (lambda x: torch.where(x.abs() > 700, -torch.sign(x), torch.tanh(x)), False),  # wrong only there
])
def test_validation_checks_where_float64_overflows_against_the_long_double_reference(candidate, passes):
    from egraph_opt.frontends.capture import capture
    x = torch.tensor([0.5, -3.0, 800.0, -2000.0, 1e4])
    program, _ = capture(_naive_tanh, (x,))
    wide = wide_reference(program, (x,))
    assert wide is not None and wide[0][2:].tolist() == [1.0, -1.0, 1.0]
    assert compare(_naive_tanh, candidate, (x,), wide).passed is passes
    assert not compare(_naive_tanh, torch.tanh, (x,)).passed  # without it: nothing to check against


def _branchy(x):
    return torch.where(x > 1.0, torch.exp(x) * 1e-30, x * 2.0)


def test_the_long_double_reference_evaluates_a_where_on_a_comparison():
    """Its condition stays boolean (as float64 it made torch.where raise, and the program fall back
    wherever the float64 reference overflowed, as FPBench's smartRoot did)."""
    from egraph_opt.frontends.capture import capture
    x = torch.tensor([0.5, -3.0, 750.0, 3.0])  # exp(750) overflows float64; the product does not
    program, _ = capture(_branchy, (x,))
    wide = wide_reference(program, (x,))
    assert wide is not None and wide[0][:2].tolist() == [1.0, -6.0]
    assert wide[0][2] == pytest.approx(math.exp(750 - 30 * math.log(10)), rel=1e-6)


def test_shapes_are_inferred_once_per_program(monkeypatch):
    """The input program and the optimized one: each infers its shapes once, and the analyses,
    costs, latency estimate and backend all read that."""
    import egraph_opt.analysis.ranges as ranges_module
    import egraph_opt.extractors.cost as cost_module
    import egraph_opt.lang.program as program_module
    from egraph_opt.lang.term import shapes

    calls = []

    def counted(roots, leaf_meta=None):
        calls.append(len(roots))
        return shapes(roots, leaf_meta)

    for module in (program_module, ranges_module, cost_module):  # the ONNX backend reads program.meta()
        monkeypatch.setattr(module, "shapes", counted)
    g = saturate_and_extract(lambda x: torch.log(torch.exp(x).sum(-1)), validate=False)
    g(torch.randn(3, 4))
    assert g.report.optimized and len(calls) == 2, calls


@pytest.mark.parametrize("validate", [True, False])
def test_an_augmented_assignment_fx_cannot_see_is_found_by_running_the_original_and_written_back(validate):
    """fx traces ``x += y`` as ``x + y``: the caller's x would be left unchanged. The original's run shows the write,
    and torch.export's functional form, traced again, writes it back."""
    def f(x, y):
        x += y
        return torch.log(1 + x.abs())

    g = saturate_and_extract(f, validate=validate)
    for _ in range(2):
        x, y = torch.randn(4), torch.randn(4)
        x2 = x.clone()
        torch.testing.assert_close(g(x, y), f(x2, y))
        torch.testing.assert_close(x, x2)
    assert g.report.optimized and "log1p" in g.report.ops_after, g.report


def test_a_custom_module_that_reads_its_training_flag_gets_a_plan_per_mode():
    class Noisy(nn.Module):
        def forward(self, x):
            return torch.exp(x) * (2.0 if self.training else 3.0)

    outer = nn.Sequential(nn.Identity(), Noisy())  # the flag that matters is a submodule's
    g = saturate_and_extract(outer)
    x = torch.randn(4)
    for mode in (False, True, False):
        outer.train(mode)
        torch.testing.assert_close(g(x), outer(x))


def test_a_bert_decorated_directly_whose_forward_fills_its_own_defaults():
    """BertModel's decorated forward sets use_cache itself: defaults are never passed again."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    g = saturate_and_extract(model)
    ids = torch.randint(0, 50, (2, 8))
    with torch.no_grad():
        out, ref = g(ids), model(ids)
    assert type(out) is type(ref) and g.report.optimized, g.report.fallback
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, rtol=1e-4, atol=1e-4)


class _DecoratedForward(nn.Module):
    """The decorator on a method in the class body, as users write it."""

    def __init__(self):
        super().__init__()
        self.lin, self.drop, self.temperature = nn.Linear(8, 8), nn.Dropout(0.5), 2.0

    @saturate_and_extract
    def forward(self, x):
        return self.plain(x)

    def plain(self, x):
        return torch.log(1 + torch.exp(self.drop(self.lin(x)) / self.temperature))


def test_a_decorated_method_is_optimized_per_instance_with_its_state_in_the_key():
    """``@saturate_and_extract`` on ``forward``: a call through an instance binds it (the call
    failed: ``self`` was not passed), each instance has plans of its own, and its attributes,
    weights and mode key them."""
    torch.manual_seed(0)
    a, b = _DecoratedForward().eval(), _DecoratedForward().eval()
    x = torch.randn(4, 8)
    for m in (a, b, a):
        torch.testing.assert_close(m(x), m.plain(x))
    assert a.forward is a.forward and a.forward is not b.forward and a.forward.report.optimized
    a.temperature = -0.5
    torch.testing.assert_close(a(x), a.plain(x))
    a.lin.weight = nn.Parameter(torch.randn(8, 8))
    torch.testing.assert_close(a(x), a.plain(x))
    torch.testing.assert_close(b(x), b.plain(x))


def test_optimizing_draws_no_random_numbers_from_the_callers_stream():
    """The first call in train mode (it optimizes: traces, validates, times) returns what the
    original returns after the same seed: dropout's mask is drawn from the caller's stream alone."""
    torch.manual_seed(0)
    m = _DecoratedForward().train()
    x = torch.randn(4, 8)
    torch.manual_seed(1)
    got = m(x)
    torch.manual_seed(1)
    torch.testing.assert_close(got, m.plain(x))


def test_autocast_gets_a_plan_of_its_own():
    """A plan made in float32 is not the plan for a call under autocast (its ops run in bfloat16):
    the call gets its own, made under autocast, and returns what the original returns there."""
    f = lambda x, w: torch.softmax(x @ w / 8, -1) @ w  # noqa: E731
    g = saturate_and_extract(f, profile_budget=0)
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    g(x, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, expected = g(x, w), f(x, w)
    assert got.dtype == expected.dtype == torch.bfloat16 and len(g.plans) == 2
    torch.testing.assert_close(got, expected)


class _Pair:
    """An object registered as a pytree (as Hugging Face's KV cache is): its tensors are inputs."""

    def __init__(self, a, b):
        self.a, self.b = a, b


torch.utils._pytree.register_pytree_node(_Pair, lambda p: ([p.a, p.b], None), lambda xs, _: _Pair(*xs))


def _returns_it(x, pair):
    pair.a = torch.exp(pair.a + x)
    return {"out": torch.log(1 + torch.exp(x * pair.b)), "pair": pair}


def _keeps_it(x, pair):
    pair.a = torch.exp(pair.a + x)
    return torch.log(1 + torch.exp(x * pair.b))


def test_a_pytree_argument_is_an_input_and_updated_in_place_where_the_original_returns_it():
    g = saturate_and_extract(_returns_it, profile_budget=0)
    x, mine, theirs = torch.randn(4), _Pair(torch.randn(4), torch.randn(4)), None
    theirs = _Pair(mine.a.clone(), mine.b.clone())
    out, ref = g(x, mine), _returns_it(x, theirs)
    assert g.report.optimized, g.report.fallback
    assert out["pair"] is mine
    torch.testing.assert_close((out["out"], mine.a), (ref["out"], theirs.a))


def test_a_pytree_argument_updated_but_not_returned_runs_the_original():
    g = saturate_and_extract(_keeps_it, profile_budget=0)
    x, mine = torch.randn(4), _Pair(torch.randn(4), torch.randn(4))
    theirs = _Pair(mine.a.clone(), mine.b.clone())
    torch.testing.assert_close((g(x, mine), mine.a), (_keeps_it(x, theirs), theirs.a))
    assert "updates argument 'pair'" in g.report.fallback


def test_complex_values_stay_opaque_and_the_real_rest_is_optimized():
    """A rotary embedding as complex products (LLaMA's reference code): a complex table sliced, a product
    over C. The rules hold over the reals (sqrt(x^2) = |x| is not so over C): every op with a complex operand
    or result stays a call of its own, and the norm and softmax around it still fuse (a complex slice once
    made the whole program fall back: no kernel took complex64)."""
    table = torch.polar(torch.ones(16, 4), torch.outer(torch.arange(16.0), torch.rand(4)))

    def f(x, w):
        rotated = torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * table[:x.shape[1]])
        y = rotated.flatten(2) * torch.rsqrt(rotated.flatten(2).pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return torch.exp(y) / torch.exp(y).sum(-1, keepdim=True)

    x, w = torch.randn(2, 12, 8), torch.randn(8)
    g = saturate_and_extract(f, profile_db=False, profile_budget=0)
    torch.testing.assert_close(g(x, w), f(x, w))
    assert g.report.optimized and not g.report.fallback, g.report.fallback
    assert {"rms_norm", "softmax"} <= set(g.report.ops_after), g.report.ops_after
