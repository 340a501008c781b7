import warnings

import pytest
import torch
import torch.nn as nn

import egraph_opt.drivers.api as api
from egraph_opt import saturate_and_extract
from egraph_opt.egraph.engine import EGraph, InvariantError
from egraph_opt.rulesets import Exactness, Family, Rule


def naive_softmax(x):
    return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)


@pytest.fixture
def compiles(monkeypatch):
    calls = []
    original = api.capture

    def counting(fn, args, *functional):
        calls.append(tuple(a.shape for a in args))
        return original(fn, args, *functional)

    monkeypatch.setattr(api, "capture", counting)
    return calls


def test_first_call_per_signature_optimizes_later_calls_reuse_the_plan(compiles):
    f = saturate_and_extract(naive_softmax)
    x = torch.randn(4, 8)
    for _ in range(3):
        torch.testing.assert_close(f(x), naive_softmax(x))
    assert len(compiles) == 1
    f(torch.randn(2, 8))  # new shape: re-specialized, not reused
    f(torch.randn(4, 8, dtype=torch.float64))  # new dtype
    assert compiles == [(torch.Size([4, 8]),), (torch.Size([2, 8]),), (torch.Size([4, 8]),)]
    assert len(f.plans) == 3



def test_the_decorated_function_has_the_originals_signature_read_without_unwrapping():
    """``generate()`` reads its forward's signature (4 times a call): the decorated forward (a function, a bound
    method, a decorated method) answers with the original's, kept, not unwrapped again (22 us) each time."""
    import inspect

    class Head(nn.Module):
        @saturate_and_extract
        def scores(self, x, mask=None, *, scale: float = 1.0):
            return x * scale

    head, model = Head(), nn.Linear(3, 2)
    for original, decorated in ((naive_softmax, saturate_and_extract(naive_softmax)),
                                (model.forward, saturate_and_extract(model.forward)),
                                (Head.scores.fn.__get__(head), head.scores)):
        assert inspect.signature(decorated) == inspect.signature(original)
        assert decorated.__signature__ is inspect.signature(decorated), "unwrapped again"

def test_a_call_unlike_the_last_one_never_runs_the_last_plan(compiles):
    """The last plan runs after one exact check of the tensors; anything else (another shape in
    turn, a tensor resized or transposed in place since) finds its own plan."""
    f = saturate_and_extract(naive_softmax)
    a, b = torch.randn(4, 8), torch.randn(2, 8)
    for x in (a, b, a, b):
        torch.testing.assert_close(f(x), naive_softmax(x))
    assert len(compiles) == 2
    a.resize_(2, 8)  # the same tensor object, now of b's shape
    torch.testing.assert_close(f(a), naive_softmax(a))
    c = torch.randn(8, 2)
    f(c.t())  # the transpose: (2, 8), not contiguous
    c.t_()  # now that transpose in place: one layout apart from b's, by its strides alone
    torch.testing.assert_close(f(c), naive_softmax(c))
    assert len(compiles) == 3 and len(f.plans) == 3


def test_a_parameter_left_to_its_default_and_one_given_get_plans_of_their_own(compiles):
    def f(x, y=None):
        return torch.exp(x) if y is None else torch.exp(x) * y

    g = saturate_and_extract(f)
    x, y = torch.randn(4), torch.randn(4)
    for _ in range(2):  # in turn: neither call runs the other's plan
        torch.testing.assert_close(g(x), f(x))
        torch.testing.assert_close(g(x, y), f(x, y))
    assert len(compiles) == 2


def test_a_call_by_keyword_runs_the_last_plan_only_where_its_names_bind_as_before(compiles):
    """The last plan runs again on one check of the tensors whether they come by position or by
    keyword; the same names in another order, or split otherwise between position and keyword,
    bind again (the check pairs tensors with parameters by where they stand)."""
    def f(x, y):
        return torch.exp(x) - y

    g = saturate_and_extract(f)
    a, b = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(g(x=a, y=b), f(a, b))
    bind, binds = g._bind, []
    g._bind = lambda args, kwargs: binds.append(kwargs) or bind(args, kwargs)
    torch.testing.assert_close(g(x=b, y=a), f(b, a))
    assert binds == []  # run on the check alone
    torch.testing.assert_close(g(y=b, x=a), f(a, b))
    torch.testing.assert_close(g(a, y=b), f(a, b))
    torch.testing.assert_close(g(a, b), f(a, b))
    assert len(binds) == 3 and len(compiles) == 2  # the keyword calls share one plan


class _Pair:
    """A registered pytree object that is no plain container, as a KV cache is."""

    def __init__(self, *tensors):
        self.tensors = list(tensors)


torch.utils._pytree.register_pytree_node(_Pair, lambda p: (p.tensors, None), lambda ts, _: _Pair(*ts))


def test_a_call_laid_out_as_the_last_runs_a_plan_without_binding_and_never_one_of_another_key(compiles):
    """Keywords, constants and a pytree object: a call laid out as the last (the same constants, an
    object of the same structure) runs the last plan, or the plan its tensors' key finds, without
    binding; any other constant (-0.0 is not 0.0, a dict changed in place), structure or unseen size
    binds, and optimizes for its own key."""
    def f(x, pair, *, scale=2.0, flag=True, opts=None):
        y = torch.exp(x) * scale + sum(pair.tensors) * (opts or {"w": 1})["w"]
        return y if flag else -y

    g = saturate_and_extract(f, profile_db=False, profile_budget=0)
    opts = {"w": 1}
    calls = [((torch.randn(4), _Pair(torch.randn(4), torch.randn(4))), {"scale": s, "flag": True, "opts": opts})
             for s in (0.0, 0.0, -0.0)]
    bind, binds = g._bind, []
    g._bind = lambda args, kwargs: binds.append(kwargs) or bind(args, kwargs)

    def check(args, kwargs, bound):
        torch.testing.assert_close(g(*args, **kwargs), f(*args, **kwargs))
        assert len(binds) == bound, binds
    check(*calls[0], 1)
    check(*calls[1], 1)  # other tensors of the same kinds, the same constants: no binding
    check(*calls[2], 2)
    assert len(compiles) == 2
    x, pair = calls[0][0]
    for changed, bound in [({"flag": False}, 3), ({"scale": 3}, 4), ({}, 5), ({}, 5)]:
        if not changed:
            opts["w"] = 2  # the same dict, another value: another key
        check((x, pair), {**calls[0][1], **changed}, bound)
    check((x, _Pair(pair.tensors[0])), calls[0][1], 6)  # another structure
    check((torch.randn(5), _Pair(torch.randn(5), torch.randn(5))), calls[0][1], 7)  # an unseen size
    check((x, pair), calls[0][1], 7)  # a size seen: the plan its key finds
    assert len(compiles) == 7 and len(g.plans) == 7


def test_a_program_no_rule_changes_runs_as_the_original_itself():
    """A rebuilt copy of the program it captured, on torch's or numpy's kernels, gains nothing over the
    original, which runs instead; a program a rule changes runs its plan."""
    x = torch.randn(4, 8)
    same = saturate_and_extract(naive_softmax, rulesets=[])
    torch.testing.assert_close(same(x), naive_softmax(x))
    (plan,) = same.plans.values()
    assert plan.run is None and same.report.optimized and not same.report.rewrites and not same.report.kernels
    changed = saturate_and_extract(naive_softmax)
    torch.testing.assert_close(changed(x), naive_softmax(x))
    (plan,) = changed.plans.values()
    assert plan.run is not None and changed.report.rewrites


def test_a_captured_program_bound_to_a_triton_kernel_runs_its_plan(monkeypatch):
    """No rule changes it, but the kernel chosen for its op is not the one the original calls."""
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")
    f = saturate_and_extract(lambda x: torch.softmax(x, -1), rulesets=[], profile_budget=0)
    x = torch.randn(4, 8)
    torch.testing.assert_close(f(x), torch.softmax(x, -1))
    (plan,) = f.plans.values()
    assert plan.run is not None and "triton.softmax" in f.report.kernels, f.report


def test_two_lists_of_weights_whose_items_move_between_them_get_plans_of_their_own():
    first, second = [torch.randn(4)], [torch.randn(4), torch.randn(4)]
    g = saturate_and_extract(lambda x: x * first[-1] + second[0])
    x = torch.randn(4)
    g(x)
    first.append(second.pop(0))  # the same three tensors, split between the lists differently
    torch.testing.assert_close(g(x), x * first[-1] + second[0])


def test_report_lists_rewrites_ops_costs_and_validation():
    f = saturate_and_extract(naive_softmax)
    assert f.report is None
    f(torch.randn(4, 8))
    text = str(f.report)
    assert "[REWRITE] softmax-fuse: exp(x) / sum(exp(x), a, true) -> softmax(x, a)" in text
    assert f.report.ops_before == {"div": 1, "exp": 2, "sum": 1}
    assert f.report.ops_after == {"softmax": 1}
    assert f.report.cost_after["curvature"] < f.report.cost_before["curvature"]
    assert f.report.validation.passed and f.report.optimized
    assert isinstance(f.egraph, EGraph) and "Softmax" in f.egraph.to_dot()


def test_report_estimates_the_error_removed_over_the_declared_ranges():
    f = saturate_and_extract(lambda x: torch.log(1 + x), input_ranges={"x": (1e-8, 1e-2)})
    f(torch.rand(4, 8) * 1e-3)
    before, after = f.report.error
    assert before.worst > 20 and after.worst <= 2 and after.mean < before.mean
    assert f"[ERROR] first-order estimate over the input ranges: worst {before.worst:.1f}" in str(f.report)


def test_a_wrong_rule_is_caught_by_validation_and_the_original_runs(monkeypatch):
    monkeypatch.setenv("EGRAPH_OPT_TRIPWIRES", "0")  # the tripwire would stop it first (below)
    wrong = Rule("exp-is-identity", "(exp ?x)", "?x", Family.ALGEBRA, Exactness.UNSAFE)
    f = saturate_and_extract(naive_softmax, rulesets=[wrong])
    x = torch.randn(4, 8)
    torch.testing.assert_close(f(x), naive_softmax(x))
    assert not f.report.optimized
    assert "validation failed" in f.report.fallback
    assert "[FALLBACK]" in str(f.report)
    assert f.report.ops_after == {"div": 1, "sum": 1}  # what was extracted, and then refused


def test_validation_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("EGRAPH_OPT_TRIPWIRES", "0")
    wrong = Rule("exp-is-identity", "(exp ?x)", "?x", Family.ALGEBRA, Exactness.UNSAFE)
    f = saturate_and_extract(naive_softmax, rulesets=[wrong], validate=False)
    x = torch.randn(4, 8)
    assert not torch.allclose(f(x), naive_softmax(x))
    assert f.report.validation is None


def test_tripwires_stop_a_wrong_rule_that_merges_contradictory_ranges():
    wrong = Rule("exp-is-identity", "(exp ?x)", "?x", Family.ALGEBRA, Exactness.UNSAFE)
    f = saturate_and_extract(naive_softmax, rulesets=[wrong], input_ranges={"x": (-1.0, 1.0)})
    with pytest.raises(InvariantError, match="tripwire: empty range"):
        f(torch.rand(4, 8) * 2 - 1)


def test_modules_and_keyword_arguments():
    mlp = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3), nn.LogSoftmax(-1)).eval()
    f = saturate_and_extract(mlp, objective="stability")
    x = torch.randn(5, 6)
    torch.testing.assert_close(f(x), mlp(x))
    torch.testing.assert_close(f(input=x), mlp(x))
    assert f.report.validation.passed


def test_opaque_calls_are_reported_and_carried_through():
    def f(x):
        return torch.log(torch.cumsum(torch.exp(x), -1))

    g = saturate_and_extract(f)
    x = torch.randn(3, 5)
    torch.testing.assert_close(g(x), f(x))
    assert any("cumsum" in line for line in g.report.opaque)
    assert "[OPAQUE]" in str(g.report)


def test_an_opaque_call_with_a_complex_result_is_carried_through():
    """No interval bounds a complex value: the analysis leaves it unbounded instead of failing."""
    def f(x):
        return torch.exp(torch.fft.fft(x).real)

    g = saturate_and_extract(f)
    x = torch.randn(4, 8)
    torch.testing.assert_close(g(x), f(x))


@pytest.mark.parametrize("options,message", [
    ({"input_ranges": {"x": (1.0, -1.0)}}, "empty"),
    ({"input_ranges": {"x": ("a", "b")}}, "pair of numbers"),
    ({"input_ranges": {"y": (0, 1)}}, "not parameters"),
    ({"objective": "fastest"}, "fastest"),
    ({"rulesets": ["stabilty"]}, "unknown ruleset"),
])
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(ValueError, match=message):
        saturate_and_extract(naive_softmax, **options)


def test_non_tensor_arguments_are_constants_of_the_plan_and_missing_ones_clear_errors():
    f = saturate_and_extract(lambda x, y: x + y)
    x = torch.randn(3)
    torch.testing.assert_close(f(x, 2), x + 2)
    torch.testing.assert_close(f(x, 3), x + 3)  # another value: another plan, not the first one
    assert len(f.plans) == 2 and f.report.optimized
    with pytest.raises(TypeError, match="missing a required argument: 'y'"):
        f(x)


def test_a_tuple_of_tensors_is_an_argument_of_tensors_and_a_tuple_of_numbers_a_constant():
    """XLNet's ``generate()`` passes its memory as a tuple of tensors, one per layer: refused as no tensor, every decode
    step ran untouched. Its tensors are inputs of the plan (new values reuse it); numbers stay constants."""
    f = saturate_and_extract(lambda x, mems, scale: torch.log(1 + torch.exp(x + mems[0] * mems[1])) * scale[0],
                             profile_budget=0)
    x, a, b = torch.randn(3), torch.randn(3), torch.randn(3)
    for mems in ((a, b), (b, a), (a, a)):
        torch.testing.assert_close(f(x, mems, (2.0,)), torch.log(1 + torch.exp(x + mems[0] * mems[1])) * 2)
    assert len(f.plans) == 1 and f.report.optimized, f.report.fallback
    f(x, (a, b), (3.0,))
    assert len(f.plans) == 2


def test_a_dict_or_list_of_tensors_is_an_argument_of_tensors_and_one_the_program_writes_into_runs_the_original():
    """With a StaticCache, ``generate()`` passes Qwen2's and Mistral's masks as a dict of them ({"full_attention": ...}):
    each decode step ran untouched ("argument 'attention_mask' is a dict"). A dict or list the program writes into
    (an item set or appended) stays the original's: a plan would not write it."""
    f = saturate_and_extract(lambda x, m: torch.log(1 + torch.exp(x + m["a"] * m["b"][0])), profile_budget=0)
    x, a, b = torch.randn(3), torch.randn(3), torch.randn(3)
    for m in ({"a": a, "b": [b]}, {"a": b, "b": [a]}):
        torch.testing.assert_close(f(x, m), torch.log(1 + torch.exp(x + m["a"] * m["b"][0])))
    assert len(f.plans) == 1 and f.report.optimized, f.report.fallback

    def writes(x, m):
        m["seen"] = x * 2
        m["b"].append(x)
        return torch.log(1 + torch.exp(x))
    g = saturate_and_extract(writes, profile_budget=0)
    for _ in range(2):
        m = {"a": a, "b": [b]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(g(x, m), torch.log(1 + torch.exp(x)))
        assert list(m) == ["a", "b", "seen"] and len(m["b"]) == 2
    assert "updates argument 'm'" in g.report.fallback, g.report.fallback


def test_none_inside_an_argument_tree_is_a_constant_of_its_plan_not_a_refusal():
    """LLaVA's ``generate()`` passes its pre-encoded image (a ModelOutput holding a list with None in it) in a dict:
    torch's pytree takes None for a leaf, and the prefill ran untouched ("argument 'mm_encoder_outputs' is a dict").
    None stays in the tree's structure; a call with a tensor where None was is keyed apart."""
    def program(x, m):
        return torch.log(1 + torch.exp(x + m["a"][0])) * (2 if m["a"][1] is None else m["a"][1])
    f, x = saturate_and_extract(program, profile_budget=0), torch.randn(3)
    for m in ({"a": [torch.randn(3), None], "b": None}, {"a": [torch.randn(3), None], "b": None},
              {"a": [torch.randn(3), torch.randn(3)], "b": None}):
        torch.testing.assert_close(f(x, m), program(x, m))
        assert f.report.optimized, f.report.fallback
    assert len(f.plans) == 2 and [p.report.ops_after.get("softplus") for p in f.plans.values()] == [1, 1]


def test_a_constant_that_changes_every_call_traces_a_bounded_number_of_plans_then_runs_the_original():
    """A sliding window StaticCache counts its tokens in a Python int (control flow reads it): each decode step's key
    was new, and each traced its own plan. As torch.compile's recompile limit: at most RETRACES per shapes."""
    f = saturate_and_extract(lambda x, n: torch.log(1 + torch.exp(x)) * n, profile_budget=0)
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in range(api.RETRACES + 3):
            torch.testing.assert_close(f(x, n), torch.log(1 + torch.exp(x)) * n)
    assert sum(p.report.optimized for p in f.plans.values()) == api.RETRACES
    assert "recompile limit" in f.report.fallback, f.report.fallback
    y = torch.randn(4)  # other shapes: traced anew
    torch.testing.assert_close(f(y, 1), torch.log(1 + torch.exp(y)))
    assert f.report.optimized


class _Box:
    """A pytree whose registered flatten refuses some of its objects, as transformers' refuses a DynamicCache of
    Mamba's layers."""

    def __init__(self, t: torch.Tensor, odd: bool = False):
        self.t, self.odd = t, odd


def _flatten_box(box: _Box):
    if box.odd:
        raise RuntimeError("this flatten takes no odd box")
    return [box.t], None


torch.utils._pytree.register_pytree_node(_Box, _flatten_box, lambda leaves, _: _Box(leaves[0]))


def test_an_argument_its_pytree_refuses_to_flatten_runs_the_original_with_the_reason():
    """The flatten's RuntimeError reached the caller: Mamba's ``generate()`` through a decorated forward raised."""
    f = saturate_and_extract(lambda x, box: torch.log(1 + torch.exp(x * box.t)), profile_budget=0)
    x = torch.randn(3)
    torch.testing.assert_close(f(x, _Box(x)), torch.log(1 + torch.exp(x * x)))
    assert f.report.optimized
    with pytest.warns(UserWarning, match="argument 'box' is a _Box"):
        torch.testing.assert_close(f(x, _Box(x, odd=True)), torch.log(1 + torch.exp(x * x)))


class _Strict(_Box):
    """A pytree whose unflatten takes tensors only: None's stand-in in its place is refused."""


def _strict_unflatten(leaves, _):
    if not isinstance(leaves[0], torch.Tensor):
        raise TypeError("a _Strict holds a tensor")
    return _Strict(leaves[0])


torch.utils._pytree.register_pytree_node(_Strict, lambda box: ([box.t], None), _strict_unflatten)


def test_a_tree_holding_none_that_its_unflatten_refuses_to_rebuild_runs_the_original_with_the_reason():
    """None's stand-in rebuilds the argument once: where its type's unflatten refuses that, no traceback reaches the
    caller; the argument is a constant the plan cannot key, and the original runs."""
    f = saturate_and_extract(lambda x, box: torch.log(1 + torch.exp(x)) * (2 if box.t is None else box.t),
                             profile_budget=0)
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="argument 'box' is a _Strict"):
        torch.testing.assert_close(f(x, _Strict(None)), torch.log(1 + torch.exp(x)) * 2)


def test_declared_input_ranges_drive_validation_inputs():
    f = saturate_and_extract(lambda x: torch.log(1 + x), input_ranges={"x": (0.0, 1e-3)})
    x = torch.rand(16) * 1e-3
    torch.testing.assert_close(f(x), torch.log1p(x))
    assert f.report.validation.passed and f.report.ops_after == {"log1p": 1}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_run_on_the_device():
    f = saturate_and_extract(naive_softmax)
    x = torch.randn(4, 8, device="cuda")
    out = f(x)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out, torch.softmax(x, -1))


@pytest.mark.parametrize("matched, accurate", [
    ({"rms-norm-fuse": 5, "rotary-fuse-x-cos-rotated-sin": 4}, False),  # fusions alone: no accuracy
    ({"rms-norm-fuse": 5, "log1p-from-log": 0}, False),  # a rule that matched nothing counts not
    ({"rms-norm-fuse": 5, "log1p-from-log": 1}, True),
    ({"a-rule-of-the-users": 1}, True),  # not in the catalogue: unknown, so it may be one
])
def test_an_incomplete_derivation_counts_for_accuracy_only_where_an_accuracy_rule_matched(matched, accurate):
    """A Llama decode step whose rms_norm and rotary fusions were not replayed in full was kept
    though measured slower, as if it bought accuracy: an incomplete replay is no evidence of it."""
    from types import SimpleNamespace

    from egraph_opt.egraph.engine import Saturation
    from egraph_opt.optimization.derivation import Derivation
    from egraph_opt.rulesets import catalogue
    assert catalogue()["log1p-from-log"].family in api.ACCURATE_FAMILIES
    result = SimpleNamespace(derivation=Derivation(complete=False),
                             saturation=[Saturation("saturate", matches=matched)])
    assert api.for_accuracy(result) is accurate


def test_the_report_times_each_phase_of_the_optimization():
    """[TIME] names saturation's phases and extraction, not only the total."""
    f = saturate_and_extract(lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), profile_db=False,
                             profile_budget=0)
    f(torch.randn(4, 8))
    assert "extract" in f.report.seconds and len(f.report.seconds) > 2, f.report.seconds
    assert "extract" in str(f.report)


class _NoGradForward(torch.nn.Module):
    """A forward decorated ``@torch.no_grad()``; below, one whose ``with torch.no_grad():`` block reads a buffer."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 8)
        self.register_buffer("steps", torch.arange(8.0))

    @torch.no_grad()
    def forward(self, x):
        y = self.layer(x)
        return torch.exp(y) / torch.exp(y).sum(-1, keepdim=True)


class _NoGradBlock(_NoGradForward):
    def forward(self, x):
        with torch.no_grad():
            scale = torch.exp(-self.steps)  # transformers' rotary cos and sin: of buffers, no grad either way
        y = self.layer(x) * scale
        return torch.exp(y) / torch.exp(y).sum(-1, keepdim=True)


def test_autograd_turned_off_inside_the_program_stays_off():
    """Values a program computes under torch.no_grad() from parameters need no grad, and gradients do not flow through
    them: a plan made with autograd on would record it there, so the original runs, saying why. Called under no_grad
    the plan runs as ever, and a no_grad block over buffers (what needs no grad anyway) changes nothing."""
    torch.manual_seed(0)
    model, x = _NoGradForward(), torch.randn(4, 8)
    f = saturate_and_extract(model)
    out = f(x)
    assert not out.requires_grad and "under torch.no_grad()" in f.report.fallback, f.report.fallback
    torch.testing.assert_close(out, model(x))
    with torch.no_grad():
        g = saturate_and_extract(_NoGradForward())
        g(x)
    assert g.report.optimized and "softmax" in g.report.ops_after, g.report
    model = _NoGradBlock()
    h = saturate_and_extract(model)
    y = h(x)
    assert h.report.optimized and y.requires_grad, h.report
    y.sum().backward()
    assert model.layer.weight.grad is not None


class _Softmaxed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.layer(x)
        return torch.exp(y) / torch.exp(y).sum(-1, keepdim=True)


def test_a_plan_made_under_autograd_is_timed_with_its_backward_writing_no_grad():
    """Where autograd records, a training step is the forward and its backward: the never-slower check times both
    (Falcon's plan, whose gathers were slower only in their backward, was kept at 0.85x a training step), through
    torch.autograd.grad, so no parameter's or input's .grad is written by the check; the caller's backward then
    gives eager's gradients."""
    torch.manual_seed(0)
    model, x = _Softmaxed(), torch.randn(4, 8, requires_grad=True)
    f = saturate_and_extract(model, profile_budget=1.0)  # the suite's default: no timing
    out = f(x)
    assert f.report.backward and f.report.measured, f.report  # kept or not: timed so
    assert "each with its backward" in str(f.report)
    assert x.grad is None and all(p.grad is None for p in model.parameters())
    out.sum().backward()
    grads = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    torch.testing.assert_close(grads, [x.grad] + [p.grad for p in model.parameters()])
    with torch.no_grad():
        g = saturate_and_extract(_Softmaxed(), profile_budget=1.0)
        g(x)
    assert g.report.measured and not g.report.backward and "each with its backward" not in str(g.report)
    h = saturate_and_extract(lambda y: torch.exp(y) / torch.exp(y).sum(-1, keepdim=True), profile_budget=1.0)
    h(torch.randn(4, 8))  # autograd on, but nothing needs a gradient: the forward alone is timed, and said so
    assert h.report.measured and not h.report.backward
