"""Size families (``drivers/families.py``): a program called at sizes that differ in one variable
is traced and optimized at two of them; the others are made from those two, built and validated,
never wrong where a size does not follow the samples."""
import warnings

import pytest
import torch

import egraph_opt.drivers.api as api
from egraph_opt import saturate_and_extract
from egraph_opt.backends.torch_backend import FoldedConstant
from egraph_opt.drivers.explore import ExploreError, explore
from egraph_opt.drivers.families import Apart, Families, Sample, Variable, at, split
from egraph_opt.lang.term import Term


def _traces(monkeypatch) -> list:
    """The sizes of each call that is traced (captured): the calls not made from a family."""
    seen, capture = [], api.capture
    monkeypatch.setattr(api, "capture", lambda fn, args, *f: seen.append(tuple(a.shape for a in args)) or capture(fn, args, *f))
    return seen


def decode(q, k, v):
    """One decode step of attention over a cache of ``n`` keys, spelled naively."""
    w = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)
    return w @ v


def _call(f, n, d=16, heads=2):
    torch.manual_seed(n)
    args = (torch.randn(heads, 1, d), torch.randn(heads, n, d), torch.randn(heads, n, d))
    return f(*args), decode(*args)


def test_a_decode_step_is_traced_at_two_cache_lengths_and_made_at_the_others(monkeypatch):
    traced, watched, watch = _traces(monkeypatch), [], api.Watch
    monkeypatch.setattr(api, "Watch", lambda fn: watched.append(fn) or watch(fn))
    f = saturate_and_extract(decode, profile_db=False, profile_budget=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (7, 8, 9, 12, 31, 56):
            out, ref = _call(f, n)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert [shapes[1][1] for shapes in traced] == [7, 8], traced
    assert watched == [decode] * 3  # two traces, one export with n a symbol: a made size runs none
    made = [p.report for p in f.plans.values() if p.report.sizes]  # 9 made: its plan serves 12, 31 and 56
    assert len(made) == 1 and all(r.optimized and r.validation.passed for r in made)
    assert "n the size at k.shape[1], v.shape[1]" in made[-1].sizes and "n = 2..64" in made[-1].sizes
    assert "it serves them all, n = 2..64 (torch.export: one graph in n)" in made[-1].sizes
    assert "[SIZES]" in str(made[-1]) and made[-1].kernels == f.plans[next(iter(f.plans))].report.kernels
    with pytest.raises(ExploreError, match="made from its size family, not saturated"):
        explore(f)


def test_sizes_past_the_familys_reach_or_apart_from_its_variable_are_traced(monkeypatch):
    traced = _traces(monkeypatch)
    f = saturate_and_extract(decode, profile_db=False, profile_budget=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n, d in ((7, 16), (8, 16), (65, 16), (9, 32), (1, 16)):
            out, ref = _call(f, n, d)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert len(traced) == 5, traced  # 65 > 8 x 8; d is a second variable; 1 broadcasts


def square(x):
    """A size that is not affine in the variable (n * n): the samples' line misses it."""
    e = x.exp()
    return (e / e.sum(-1, keepdim=True)).reshape(-1)


def test_a_size_off_the_samples_lines_is_optimized_not_made_wrong(monkeypatch):
    traced = _traces(monkeypatch)
    f = saturate_and_extract(square, profile_db=False, profile_budget=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (3, 4, 6):
            x = torch.randn(n, n)
            torch.testing.assert_close(f(x), square(x))
            assert f.report.optimized and f.report.kernels.get("torch.softmax") == 1, f.report
    assert len(traced) == 3


def prints(x):
    print("called")  # a side effect: every size falls back
    return x.exp() + 1.0


def test_a_family_that_fell_back_twice_falls_back_at_once_saying_why(monkeypatch, capsys):
    traced = _traces(monkeypatch)
    f = saturate_and_extract(prints, profile_db=False, profile_budget=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (5, 6, 9):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), x.exp() + 1.0)
    assert len(traced) == 2 and capsys.readouterr().out.count("called") == 3
    assert f.report.fallback.startswith("so did its size family: ") and "prints" in f.report.fallback


def test_one_plan_runs_the_original_at_each_size_of_a_family_that_fell_back(monkeypatch, capsys):
    """A decode step's new cache length costs a C++ check, not a plan of its own (a key, a walk of the state: 5 ms a
    step of a fallen-back Llama's generate()); a size past the family's reach, or of another shape, is traced."""
    traced = _traces(monkeypatch)
    f = saturate_and_extract(prints, profile_db=False, profile_budget=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (5, 6, *range(7, 49), 7, 30):  # 48 = REACH x 6
            x = torch.randn(n)
            torch.testing.assert_close(f(x), x.exp() + 1.0)
        assert len(f.plans) == 3 and len(traced) == 2 and f.report.fallback.startswith("so did its size family: ")
        for shape in ((49,), (2, 7), (1,)):  # past its reach; another rank; a size 1 (which broadcasts)
            x = torch.randn(shape)
            torch.testing.assert_close(f(x), x.exp() + 1.0)
    assert len(traced) == 5 and capsys.readouterr().out.count("called") == 49


def test_a_long_decode_loop_keeps_each_sizes_folded_mask(monkeypatch):
    """A generation of hundreds of tokens meets hundreds of sizes: each keeps its folded causal mask (and its mask
    facts), so the next generation computes none (cleared at 64 sizes, a 300-token generation recomputed every
    mask on every pass: 0.96x eager; 1.12x kept). The samples' sizes are the family plan's too: computed once more."""
    f = saturate_and_extract(heads, profile_db=False, profile_budget=0)
    runs, run = [], FoldedConstant.run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for second in (False, True):  # the samples, then 100 sizes, twice
            if second:
                monkeypatch.setattr(FoldedConstant, "run", lambda self, reads: runs.append(n) or run(self, reads))
            for n in range(20, 122):
                x, keep = torch.randn(2, n, 16), torch.ones(2, 1, 1, n, dtype=torch.bool)
                out = f(x, keep)
        torch.testing.assert_close(out, heads(x, keep), rtol=1e-5, atol=1e-6)
    assert "it serves them all" in f.report.sizes and set(runs) <= {20, 21}, runs


def test_folded_values_are_kept_per_size_up_to_their_memory_bound():
    """A size's folded value (a generation's mask) is made once, kept until the kept ones pass 64 MiB, then all are
    dropped and made again as met: counted as made (summing every kept value per new size was quadratic)."""
    from torch import fx
    graph = fx.Graph()
    n = graph.placeholder("n")
    folded = FoldedConstant([n, graph.call_function(torch.ones, (n, 1 << 20))], [n], 0)  # 4 MiB a unit of n
    made, run = [], folded.run
    folded.run = lambda reads: made.append(reads[0]) or run(reads)
    for size in (1, 2, 3, 4, 1, 2, 3, 4, 8, 9, 1, 9):  # 40 MiB kept; 72 MiB with 8: dropped before 9 is kept
        assert folded(size).shape == (size, 1 << 20)
    assert made == [1, 2, 3, 4, 8, 9, 1], made


def last_twelve(q, k):
    """Attention over the last 12 keys once there are more: a branch on the family's size (a sliding window)."""
    k = k[:, -12:] if k.shape[1] > 12 else k
    return torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ k


def test_one_plan_serves_a_family_only_where_the_original_takes_no_other_branch(monkeypatch):
    """torch.export, taking n as a symbol, bounds the sizes the made plan serves by the branch (n <= 12); past it each
    size is made and validated, the window's are not the samples': traced anew (each equal to eager)."""
    traced = _traces(monkeypatch)
    f = saturate_and_extract(last_twelve, profile_db=False, profile_budget=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in range(7, 21):
            torch.manual_seed(n)
            q, k = torch.randn(2, 1, 8), torch.randn(2, n, 8)
            torch.testing.assert_close(f(q, k), last_twelve(q, k), rtol=1e-5, atol=1e-6)
    assert [shapes[1][1] for shapes in traced][:3] == [7, 8, 13], traced
    assert "serves them all, n = 2..12 " in next(p for p in f.plans.values() if p.report.sizes).report.sizes


def skips_seven(x):
    """A branch on one size, which no range of sizes states: torch.export keeps it as a guard ``n != 7``."""
    e = (x * (2.0 if x.shape[0] != 7 else 3.0)).exp()
    return e / e.sum(-1, keepdim=True)


def test_a_guard_on_one_size_bounds_the_sizes_one_plan_serves(monkeypatch):
    """The made plan at n = 8 serves 8 and above, not 7 (its guard ``n != 7`` splits the sizes there): 7 is made and
    validated for itself, fails, and is traced (equal to eager at every size; served by n = 8's plan, it was not)."""
    traced = _traces(monkeypatch)
    f = saturate_and_extract(skips_seven, profile_db=False, profile_budget=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (5, 6, 8, 9, 7, 10, 3):
            x = torch.randn(n, 4)
            torch.testing.assert_close(f(x), skips_seven(x))
            assert f.report.optimized and f.report.ops_after.get("softmax") == 1, f.report  # a fused plan, any device
    assert [shapes[0][0] for shapes in traced][:3] == [5, 6, 7], traced  # 7 a sample now: 10 and 3 of (6, 7)'s


def max_guarded(x, m):
    """Mistral's mask sizes as torch.export records them: a guard holding ``torch.sym_max`` (``Max`` in the ShapeEnv)."""
    if x.shape[0] - m.shape[0] + torch.sym_max(0, x.shape[0] - 10) + 1 <= 0:
        return x * 2
    return x * 3


def test_the_sizes_one_graph_serves_read_guards_holding_a_max():
    """torch's own ``Max`` in a guard made sympy's solver recurse without end: no range was found, and a decode step
    under a sliding window's mask (Mistral's, Gemma 2's) was made and validated at every cache length. Now its range
    is the guard's, n <= 10 (the other branch past it), from any size inside."""
    from egraph_opt.frontends.capture import free_sizes
    for n in (3, 7, 10):
        assert free_sizes(max_guarded, (torch.randn(n, 4), torch.randn(n + 1, 4)), [(0, 0), (1, 0)]) == (2, 10)
    assert free_sizes(max_guarded, (torch.randn(12, 4), torch.randn(13, 4)), [(0, 0), (1, 0)])[1] > 12  # the other branch's


def test_instantiation_keeps_equal_parts_and_refuses_what_a_size_does_not_explain():
    x8, x9 = Term.input("x", (2, 8)), Term.input("x", (2, 9))
    a, b = Term("reshape", (x8,), ("16",)), Term("reshape", (x9,), ("18",))
    made = at((a, a, 1.5), (b, b, 1.5), (8, 9, 20))
    assert made[0].attrs == ("40",) and made[0].args[0].attrs[1] == "2,20" and made[0] is made[1]
    with pytest.raises(Apart):
        at(Term.const(1 / 8), Term.const(1 / 9), (8, 9, 20))  # a mean's divisor: no line
    with pytest.raises(Apart):
        at(3, 6, (8, 10, 11))  # a slope of 3/2
    assert at(3, 5, (8, 10, 12)) == 7
    (shape, sizes) = split(((torch.Size([2, 8]), torch.float32), torch.Size([8])))
    variable = Variable.of(sizes, (2, 9, 9))
    assert shape == ((("rank", 2), torch.float32), ("rank", 1)) and variable.n((2, 30, 30)) == 30
    assert variable.n((3, 30, 30)) is None and variable.n((2, 30, 31)) is None


def test_a_sample_extracted_otherwise_than_its_neighbours_pairs_not_the_size_after_it():
    """Extraction may price a near tie apart at two sizes (Llama's prefill: grouped keys at 8 and 10 tokens, repeated
    at 9): 10 pairs with 8, so 11 is made from them, not traced again; a size that agrees with none pairs with the
    newest."""
    def sample(n: int, op: str) -> tuple:
        x = Term.input("x", (2, n))
        return ((torch.Size([2, n]), torch.float32),), Sample((), None, optimized=Term(op, (x,), ()))
    families = Families()
    for n, op in ((8, "exp"), (9, "expm1"), (10, "exp")):
        families.record(*sample(n, op))
    first, second, variable, n = families.find(sample(11, "exp")[0])
    assert (first.sizes, second.sizes, n) == ((2, 8), (2, 10), 11) and at(first.optimized, second.optimized, (
        8, 10, 11)).args[0].attrs[1] == "2,11"
    families.record(*sample(12, "log"))
    assert [s.sizes for s in families.find(sample(13, "log")[0])[:2]] == [(2, 10), (2, 12)]


def test_where_a_sample_measured_slower_the_familys_other_sizes_fall_back(monkeypatch):
    """Never slower: a family whose second sample measured slower than its original (forced
    here: timing noise decides real cases) runs the original at its other sizes."""
    verdicts = iter([False, True])
    monkeypatch.setattr(api, "slower_for_nothing", lambda *a: next(verdicts))
    traced = _traces(monkeypatch)
    f = saturate_and_extract(decode, profile_db=False, profile_budget=5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (7, 8, 12):
            out, ref = _call(f, n)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert len(traced) == 2 and f.report.sizes
    assert f.report.fallback.startswith("so did its size family: it measured slower"), f.report.fallback


def test_a_size_made_from_its_family_binds_triton_kernels_and_reads_nothing_on_the_host(monkeypatch):
    """The GPU path (Triton kernels on CPU tensors under the interpreter, the device path forced):
    the made plan binds the samples' Triton kernels, validates, and its run reads no value on the host."""
    import os
    import sys
    from egraph_opt.kernels import torch_ops as ops
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    from gpu import HostReads
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")
    traced = _traces(monkeypatch)
    f = saturate_and_extract(decode, profile_db=False, profile_budget=0)
    with warnings.catch_warnings(), torch.no_grad():  # grad mode is part of a plan's key
        warnings.simplefilter("ignore")
        for n in (7, 8, 12):
            _call(f, n)
        with ops.forcing_device_path(), HostReads() as reads:
            out, ref = _call(f, 12)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert len(traced) == 2 and f.report.sizes and f.report.validation.passed, f.report
    assert any(k.startswith("triton.") for k in f.report.kernels) and reads.reads == [], f.report


def _builds(monkeypatch) -> list:
    """The sizes each module is built for (``build_module``): the samples', and sizes built alone."""
    seen, build = [], api.build_module
    monkeypatch.setattr(api, "build_module", lambda program, *a, **k: seen.append(
        tuple(t.attrs[1] for t in program.inputs)) or build(program, *a, **k))
    return seen


def heads(x, keep):
    """Attention over ``n`` tokens whose sizes are views, a reshape by ``n * c`` and a causal mask
    made from ``n`` (a constant of no input: folded, once per size by the family's module)."""
    b, n, c = x.shape
    q = x.view(b, n, 2, c // 2).transpose(1, 2)
    causal = torch.ones(n, n, dtype=torch.bool).tril() & keep
    s = (q @ q.transpose(-1, -2) / 4.0).masked_fill(~causal, float("-inf"))
    return (s.softmax(-1) @ q).transpose(1, 2).reshape(b, n * c)


def test_a_decode_loop_builds_one_module_per_family_equal_to_eager_at_every_size(monkeypatch):
    """Sizes 5 and 6 are traced and built; 7..48 (to 8 x 6) run one module made from theirs, made and
    validated at 7, one plan for all (torch.export finds one graph in n), equal to eager at each; 49 is
    past the family's reach: traced and built on its own."""
    traced, built = _traces(monkeypatch), _builds(monkeypatch)
    f = saturate_and_extract(heads, profile_db=False, profile_budget=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in [*range(5, 49), 49]:
            torch.manual_seed(n)
            x, keep = torch.randn(2, n, 16), torch.rand(2, 1, 1, n) > 0.3
            keep[..., 0] = True
            torch.testing.assert_close(f(x, keep), heads(x, keep), rtol=1e-5, atol=1e-6)
            assert f.report.optimized and "sdpa_masked" in f.report.ops_after, f.report
            assert n in (5, 6, 49) or f.report.validation.passed and f.report.sizes.startswith(
                "n = 2..48, n the size at x.shape[1], keep.shape[3]: made at n = 7 from the plans traced at n = 5 "
                "and 6; it serves them all") and "built for this size" not in f.report.sizes, f.report.sizes
    assert len(f.plans) == 4
    assert [shapes[0][1] for shapes in traced] == [5, 6, 49] and len(built) == 3, (traced, built)
    runs, run, calls, call = [], FoldedConstant.run, [], FoldedConstant.__call__
    monkeypatch.setattr(FoldedConstant, "run", lambda self, reads: runs.append(1) or run(self, reads))
    monkeypatch.setattr(FoldedConstant, "__call__", lambda self, *reads: calls.append(reads) or call(self, *reads))
    for n in range(7, 49):  # again: the mask each size reads was computed at its first call, and kept
        f(torch.randn(2, n, 16), torch.ones(2, 1, 1, n, dtype=torch.bool))
    assert not runs and len({r for reads in calls for r in reads if isinstance(r, str)}) == 42  # its shape



def attends_to_past(q, k, v):
    """A decode step's attention over a mask its sizes make, as transformers' ``sdpa_mask`` does: the mask, its rows'
    maxima and their exponentials (torch's 0 for a row with no key) are three folded values of the size; a softplus
    spelled out after it makes the plan change something."""
    n, t = k.shape[-2], q.shape[-2]
    keep = torch.arange(n)[None, :] <= torch.arange(t)[:, None] + (n - t)
    return torch.log(1 + torch.exp(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)))


def test_values_folded_from_one_mask_make_it_once_per_size(monkeypatch):
    """Each later folded value reads the mask an earlier one made, not making it again: at a new size of a
    generation (each decode step's), its arange runs once, not once per value that reads it."""
    f = saturate_and_extract(attends_to_past, profile_db=False, profile_budget=0)
    made = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (5, 6, 9):
            if n == 9:
                run = FoldedConstant.run
                monkeypatch.setattr(FoldedConstant, "run", lambda self, reads: made.extend(
                    str(step[1]) for step in self.steps) or run(self, reads))
            q, k, v = torch.randn(2, 1, 8), torch.randn(2, n, 8), torch.randn(2, n, 8)
            torch.testing.assert_close(f(q, k, v), attends_to_past(q, k, v), rtol=1e-5, atol=1e-6)
    assert f.report.sizes.startswith("n = 2..48") and f.report.validation.passed, f.report
    assert sum("arange" in step for step in made) == 1, made  # arange(n) (arange(t), t = 1, is a constant)

def windowed(q, k):
    """Scores scaled down past a window of 12 keys: a branch on a size, which a trace specializes."""
    s = q @ k.transpose(-1, -2)
    if k.shape[1] > 12:
        s = s * 0.5
    return s.softmax(-1).log()


def test_a_size_where_the_original_branches_fails_validation_and_is_traced(monkeypatch):
    """Why each size made from a family is validated: two samples do not show where the original
    takes another branch, so a plan run unchecked there would be wrong. The samples 8 and 20 then
    straddle the branch (21 is traced too); 21 and 22 do not."""
    traced = _traces(monkeypatch)
    f = saturate_and_extract(windowed, profile_db=False, profile_budget=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (7, 8, 10, 20, 21, 22):
            q, k = torch.randn(2, 1, 16), torch.randn(2, n, 16)
            torch.testing.assert_close(f(q, k), windowed(q, k))
            assert f.report.optimized and "log_softmax" in f.report.ops_after, f.report
    assert [shapes[1][1] for shapes in traced] == [7, 8, 20, 21], traced
    assert "made at n = 22 from the plans traced at n = 20 and 21" in f.report.sizes, f.report.sizes


@pytest.mark.parametrize("refused", [False, True])
def test_samples_binding_one_op_to_different_kernels_share_the_first_samples(refused, monkeypatch):
    """A kernel chosen by latency at one sample and not the other (forced: another attention kernel at n = 8; GPT-2's
    oneDNN linear at 8 tokens, not at 9, by a near tie): each is the op, so the family's one module binds the first
    sample's and serves every size, validated and equal to eager (each size built and validated its own before).
    Where the first sample's kernel refuses the other's operands (forced), each size is built for itself."""
    import dataclasses
    from egraph_opt.backends import torch_backend
    bind, ready, refusing = torch_backend.bind, torch_backend.ready, [False]

    def by_size(use, *rest):
        kernel = bind(use, *rest)
        refusing[0] = refused and use.op == "sdpa" and use.shapes[1][-2] == 8
        if use.op == "sdpa" and use.shapes[1][-2] == 8:
            return dataclasses.replace(kernel, impl=lambda *a, **k: kernel.impl(*a, **k))
        return kernel
    monkeypatch.setattr(torch_backend, "bind", by_size)
    monkeypatch.setattr(torch_backend, "ready", lambda use: [] if refusing[0] else ready(use))
    traced, built = _traces(monkeypatch), _builds(monkeypatch)
    f = saturate_and_extract(decode, profile_db=False, profile_budget=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (7, 8, 9, 12):
            out, ref = _call(f, n)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert len(traced) == 2 and len(built) == 2 + 2 * refused and f.report.validation.passed, (traced, built)
    assert ("built for this size, the samples' modules differ: sdpa against <lambda>" in f.report.sizes) == refused
    assert ("it serves them all" in f.report.sizes) != refused, f.report.sizes


@pytest.mark.parametrize("what", ["region", "configuration"])
def test_a_kernel_fixed_by_a_size_at_build_makes_each_size_build_its_own(what, monkeypatch):
    """The GPU path under the interpreter: a region's generated kernel holds its shapes, and a tuned
    Triton configuration is looked up by shape (forced here to differ between the samples): neither
    is a size a call can pass, so each size is built for itself."""
    from egraph_opt.kernels import binding
    monkeypatch.setenv("EGRAPH_OPT_TRITON_ON_CPU", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if what == "configuration":
        def tuned(latency):
            estimate = binding.measured_estimate(latency)
            estimate.config = lambda kernel, use: getattr(kernel.impl, "configs", [None] * 4)[use.shapes[1][-2] % 4] \
                if use.op == "sdpa" else None
            return estimate
        monkeypatch.setattr(api, "measured_estimate", tuned)
    built = _builds(monkeypatch)
    f = saturate_and_extract(decode if what == "configuration" else lambda x: torch.tanh(x * 2.0 + 1.0) * 0.5,
                             profile_db=False, profile_budget=0)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        for n in (7, 8, 9, 12):
            if what == "configuration":
                out, ref = _call(f, n)
            else:
                x = torch.randn(3, n)
                out, ref = f(x), torch.tanh(x * 2.0 + 1.0) * 0.5
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert len(built) == 4 and "built for this size" in f.report.sizes and f.report.validation.passed, f.report
    assert any(k.startswith("triton.") for k in f.report.kernels), f.report.kernels
