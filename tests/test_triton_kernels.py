"""Triton kernels against their reference terms, under TRITON_INTERPRET=1 on CPU tensors.

Every kernel is compared with the op's torch implementation (or the float64 reference evaluator)
on float64 copies of the same inputs, at float32 and float16, on odd sizes: rows of length 1 and
non-powers of two, masked tails, rows longer than one block. Errors are printed (``-rP``).
"""
import math
import os
import subprocess
import sys

os.environ["TRITON_INTERPRET"] = "1"  # read when @triton.jit decorates: before triton imports

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from triton.language import sum as _tl_sum  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from egraph_opt.lang import ops  # noqa: E402
from egraph_opt.kernels import triton as K  # noqa: E402
from egraph_opt.kernels.triton import codegen  # noqa: E402
from egraph_opt.lang.term import Term, evaluate, postorder, pretty  # noqa: E402

if not isinstance(_tl_sum, InterpretedFunction):  # triton.language itself was decorated natively
    pytest.fail("triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot "
                "run on CPU: set the variable in tests/conftest.py or the environment",
                pytrace=False)

# numpy evaluates both sides of every tl.where in the interpreter: log(0) in a discarded branch
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

DTYPES = [torch.float32, torch.float16]
RTOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}
ROWS = [1, 7, 33, 1000, 1025]  # 1025: two blocks, the second masked down to one element


@pytest.fixture(autouse=True, scope="module")
def _private_kernel_cache(tmp_path_factory):
    """Generated kernels go to a temporary cache, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EGRAPH_OPT_CACHE", str(tmp_path_factory.mktemp("egraph_opt_cache")))
        yield


def check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "", rtol=None):
    """``out`` (dtype) within ``rtol`` (RTOL by default) of the float64 ``ref``, relative to each
    value or, near zero, to the largest reference value."""
    assert out.dtype == dtype and out.shape == ref.shape
    rtol = rtol or RTOL[dtype]
    finite = ref.isfinite()
    scale = ref[finite].abs().max().item() if finite.any() else 0.0
    err = (out.double() - ref)[finite].abs()
    print(f"{what} {dtype}: max abs err {err.max().item() if err.numel() else 0:.3g}, "
          f"max |ref| {scale:.3g}")
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=rtol * max(scale, 1e-30),
                               equal_nan=True)


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float64) * scale).to(dtype)


# ---- softmax, log_softmax, logsumexp ------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_rows(name, n, dtype):
    x = randn(3, n, dtype=dtype, scale=4.0)
    check(getattr(K, name)(x, -1), getattr(ops, name)(x.double(), -1), dtype, f"{name} n={n}")


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_inner_axis(name):
    x = randn(4, 33, 5)
    check(getattr(K, name)(x, 1), getattr(ops, name)(x.double(), 1), torch.float32, name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 33, 1025])
@pytest.mark.parametrize("axis, keepdim", [(-1, False), (0, True)])
def test_logsumexp(n, dtype, axis, keepdim):
    x = randn(n, 3, dtype=dtype, scale=4.0) if axis == 0 else randn(3, n, dtype=dtype, scale=4.0)
    check(K.logsumexp(x, axis, keepdim), torch.logsumexp(x.double(), axis, keepdim), dtype,
          f"logsumexp n={n}")


def test_logsumexp_stays_finite_where_the_naive_form_overflows():
    x = torch.tensor([[1e4, 1e4 - 1.0, -1e4], [-1e4, -1e4, -1e4]])
    assert torch.isinf(torch.log(torch.exp(x).sum(-1))).all()
    check(K.logsumexp(x, -1, False), torch.logsumexp(x.double(), -1, False), torch.float32)


# ---- cross entropy ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("classes", [1, 7, 1025])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(classes, dtype, reduction):
    logits = randn(6, classes, dtype=dtype, scale=3.0)
    target = torch.randint(0, classes, (6,))
    target[[1, 4]] = -100
    ref = ops.cross_entropy(logits.double(), target, reduction, -100)
    check(K.cross_entropy(logits, target, reduction, -100), ref, dtype, f"cross_entropy C={classes}")


def test_cross_entropy_spatial_and_custom_ignore_index():
    logits, target = randn(2, 5, 3), torch.randint(0, 5, (2, 3))
    target[0, 1] = 7
    ref = F.cross_entropy(logits.double(), target, ignore_index=7)
    check(K.cross_entropy(logits, target, "mean", 7), ref, torch.float32, "cross_entropy (N, C, d)")


def test_cross_entropy_edge_rows():
    logits = randn(3, 4)
    all_ignored = torch.full((3,), -100)
    assert torch.isnan(K.cross_entropy(logits, all_ignored))  # 0 / 0, as torch
    assert torch.isnan(K.cross_entropy(logits, torch.tensor([0, 9, 1])))  # class 9 out of range


def test_row_kernels_keep_the_ops_values_at_the_extremes():
    """Rows holding +inf, NaN, -inf, or a first block of -inf before finite values (a row longer
    than one block): softmax, log_softmax, logsumexp and cross entropy as the ops give them."""
    inf, nan = float("inf"), float("nan")
    x = torch.zeros(6, 1500)
    x[0, 3] = inf  # the naive quotient: NaN at +inf, 0 (-inf for the log) elsewhere
    x[1, 5], x[1, 9] = inf, nan  # a NaN: the row is NaN
    x[2, :1200] = -inf  # the first block all -inf
    x[3] = -inf  # every key masked: NaN, and logsumexp -inf
    x[4, 7] = -inf
    x[5, 0] = 3e38
    target = torch.tensor([3, 0, 1300, 2, 7, 1])
    for name in ("softmax", "log_softmax"):
        torch.testing.assert_close(getattr(K, name)(x, -1), getattr(ops, name)(x, -1), equal_nan=True)
    torch.testing.assert_close(K.logsumexp(x, -1, False), torch.logsumexp(x, -1, False), equal_nan=True)
    torch.testing.assert_close(K.cross_entropy(x, target, "none", -100),
                               ops.cross_entropy(x, target, "none", -100), equal_nan=True)
    torch.testing.assert_close(K.cross_entropy(x[[0]], target[[1]], "none", -100),
                               torch.tensor([inf]))  # +inf off the target: the loss is +inf


# ---- layer norm ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROWS)
def test_layer_norm(n, dtype):
    x, w, b = randn(3, n, dtype=dtype), randn(n, dtype=dtype), randn(n, dtype=dtype)
    ref = ops.layer_norm(x.double(), w.double(), b.double(), 1e-5)
    check(K.layer_norm(x, w, b, 1e-5), ref, dtype, f"layer_norm n={n}")


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)])
def test_layer_norm_optional_affine_and_large_mean(affine):
    """At mean 1000 the float32 mean itself is off by ~ulp(1000) = 6e-5, hence rtol 1e-3; the
    one-pass variance E[x^2] - E[x]^2 cancels to an error far beyond it."""
    x = randn(2, 3, 33) + 1000.0
    w, b = (randn(33) if on else None for on in affine)
    ref = ops.layer_norm(x.double(), *(t.double() if t is not None else None for t in (w, b)), 1e-5)
    check(K.layer_norm(x, w, b, 1e-5), ref, torch.float32, f"layer_norm affine={affine}", 1e-3)
    one_pass_var = (x * x).mean(-1) - x.mean(-1) ** 2
    assert ((one_pass_var.double() - x.double().var(-1, correction=0)).abs() > 1e-2).any()


# ---- attention ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16])  # bfloat16: tl.dot's operands widened
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L, S, E, EV", [(1, 1, 16, 16), (17, 17, 24, 24), (70, 70, 64, 64),
                                         (17, 70, 128, 128), (70, 17, 16, 40)])
def test_sdpa(L, S, E, EV, causal, dtype):
    q, k, v = randn(2, L, E, dtype=dtype), randn(2, S, E, dtype=dtype), randn(2, S, EV, dtype=dtype)
    scale = E ** -0.5
    ref = ops.sdpa(q.double(), k.double(), v.double(), scale, causal)
    check(K.sdpa(q, k, v, scale, causal), ref, dtype, f"sdpa L={L} S={S} E={E} causal={causal}")


def test_sdpa_broadcast_batch_and_default_scale():
    q, k, v = randn(2, 3, 9, 16), randn(1, 3, 11, 16), randn(1, 3, 11, 16)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    check(K.sdpa(q, k, v, None, False), ref, torch.float32, "sdpa broadcast")


def test_masked_sdpa_keeps_the_definitions_extremes():
    """A bias row masked throughout is NaN, a keep-mask row keeping none averages v; a first tile
    of masked keys adds nothing to a row that sees a later key; masks broadcast over batch dims."""
    q, k, v = randn(2, 3, 70, 16), randn(2, 3, 70, 16), randn(2, 3, 70, 16)
    keep = torch.ones(70, 70, dtype=torch.bool).tril()
    keep[5] = False
    keep[69, :66] = False  # sees keys 66..69 only: a whole first tile masked
    bias = torch.zeros(70, 70).masked_fill(~keep, -math.inf)
    for got, ref in ((K.sdpa_masked(q, k, v, bias, 0.25),
                      ops.sdpa_masked(q.double(), k.double(), v.double(), bias.double(), 0.25)),
                     (K.sdpa_filled(q, k, v, keep, 0.25, -3.4e38),
                      ops.sdpa_filled(q.double(), k.double(), v.double(), keep, 0.25, -3.4e38))):
        assert (got.isnan() == ref.isnan()).all()
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert K.sdpa_masked(q, k, v, bias, 0.25)[:, :, 5].isnan().all()
    torch.testing.assert_close(K.sdpa_filled(q, k, v, keep, 0.25, -3.4e38)[:, :, 5], v.mean(-2))


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_reads_fewer_kv_heads_at_head_h_over_g(causal):
    """Grouped-query attention (``ops.groups``): q's head h reads k's and v's head h // G, in
    place; a k grouped and a v not (v repeated then), masks broadcast over the heads."""
    q, k, v = randn(2, 6, 17, 16), randn(2, 2, 70, 16), randn(2, 2, 70, 24)
    keep = torch.rand(2, 1, 17, 70) < 0.8
    keep[..., 3, :] = False
    bias = torch.zeros(keep.shape).masked_fill(~keep, -math.inf)
    wide = [t.double() for t in (q, k, v)]
    check(K.sdpa(q, k, v, 0.25, causal), ops.sdpa(*wide, 0.25, causal), torch.float32, "grouped sdpa")
    check(K.sdpa(q, k, v.repeat_interleave(3, 1), 0.25, causal), ops.sdpa(*wide, 0.25, causal),
          torch.float32, "grouped k only")
    check(K.sdpa_masked(q, k, v, bias, 0.25), ops.sdpa_masked(*wide, bias.double(), 0.25), torch.float32,
          "grouped sdpa_masked")
    check(K.sdpa_filled(q, k, v, keep, 0.25, -3.4e38), ops.sdpa_filled(*wide, keep, 0.25, -3.4e38),
          torch.float32, "grouped sdpa_filled")


# ---- linear + activation ------------------------------------------------------------------

ACTIVATIONS = {"none": lambda y: y, "relu": F.relu, "gelu": F.gelu,
               "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}


@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_linear_act(activation, dtype):
    x, w, b = randn(3, 5, 33, dtype=dtype), randn(20, 33, dtype=dtype), randn(20, dtype=dtype)
    ref = ACTIVATIONS[activation](F.linear(x.double(), w.double(), b.double()))
    check(K.linear_act(x, w, b, activation), ref, dtype, f"linear_act {activation}")


def test_linear_act_long_reduction_without_bias():
    x, w = randn(7, 1000), randn(70, 1000)
    check(K.linear_act(x, w, None, "relu"), F.relu(F.linear(x.double(), w.double())),
          torch.float32, "linear_act K=1000")


def test_linear_act_refuses_unknown_activation():
    with pytest.raises(ValueError, match="silu"):
        K.linear_act(randn(2, 16), randn(16, 16), None, "silu")


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_float32_products_use_tf32_only_where_torch_allows_it(precision, monkeypatch):
    """The matmul-like kernels pass torch's float32 matmul setting to ``tl.dot``; half stays exact."""
    from egraph_opt.kernels.triton import attention, linear
    seen = []

    class Spy:  # the launch, noting the precision it passes
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(kwargs["PRECISION"])
                return self.kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(linear, "_linear_act_kernel", Spy(linear._linear_act_kernel))
    monkeypatch.setattr(attention, "_sdpa_kernel", Spy(attention._sdpa_kernel))
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        for dtype in (torch.float32, torch.float16):
            K.linear_act(randn(3, 16, dtype=dtype), randn(16, 16, dtype=dtype), None, "none")
            K.sdpa(*(randn(1, 16, 16, dtype=dtype) for _ in range(3)), None, False)
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen == ["ieee" if precision == "highest" else "tf32"] * 2 + ["ieee"] * 2


# ---- tuned configurations ----------------------------------------------------------------

def _config_examples():
    """Small operands of every Triton kernel, past the smallest tile cap of each configuration (rows
    of 300 against blocks of 256 and 512; 70 x 90 x 80 products; 130 queries and keys), so that each
    configuration launches other tiles than the default."""
    keep = torch.ones(130, 130, dtype=torch.bool).tril()
    q, k, v = randn(2, 130, 32), randn(2, 130, 32), randn(2, 130, 32)
    return {"softmax": ([randn(3, 300)], (-1,)), "log_softmax": ([randn(3, 300)], (-1,)),
            "logsumexp": ([randn(3, 300)], (-1, True)),
            "layer_norm": ([randn(3, 300), randn(300), randn(300)], (1e-5,)),
            "cross_entropy": ([randn(4, 300), torch.tensor([0, 299, -100, 7])], ("mean", -100)),
            "linear_act": ([randn(70, 80), randn(90, 80), randn(90)], ("gelu",)),
            "sdpa": ([q, k, v], (None, True)),
            "sdpa_masked": ([q, k, v, randn(130, 130).masked_fill(~keep, -math.inf)], (0.2,)),
            "sdpa_filled": ([q, k, v, keep], (0.2, -1e4))}


@pytest.mark.parametrize("op", sorted(K.TRITON_KERNELS))
def test_every_configuration_of_a_kernel_computes_what_its_default_does(op):
    """Each kernel declares configurations (tiles, warps, stages; the default first, as it launched
    before any was declared); each gives the default's result within float32 rounding."""
    wrapper = K.TRITON_KERNELS[op][0]
    operands, attrs = _config_examples()[op]
    assert len(wrapper.configs) > 1 and all({"num_warps", "num_stages"} <= set(c) for c in wrapper.configs)
    assert len({str(sorted(c.items())) for c in wrapper.configs}) == len(wrapper.configs)
    default = wrapper(*operands, *attrs)
    for config in wrapper.configs:
        check(wrapper(*operands, *attrs, config=config), default.double(), torch.float32, f"{op} {config}")


def _region_terms():
    """Generated kernels of each kind on rows of 300 (blocks of 256, 1024 and 4096 read them differently)."""
    x, w = Term.input("x", (3, 300)), Term.input("w", (300,))
    chain = Term("tanh", (Term("mul", (x, w)),))
    return [chain, Term("sum", (chain,), (-1, False)), Term("add", (Term("softmax", (chain,), (-1,)), x)),
            Term("add", (Term("layer_norm", (chain, w, w), (1e-5,)), x)), Term("rms_norm", (chain, w), (1e-6,))]


@pytest.mark.parametrize("index", range(5))
def test_every_configuration_of_a_generated_kernel_computes_what_its_default_does(index):
    """A region's generated kernel declares the row kernels' configurations; each gives the default's
    result within float32 rounding."""
    kernel, env = K.generate_elementwise(_region_terms()[index]), {"x": randn(3, 300), "w": randn(300)}
    default = kernel(**env)
    for config in kernel.configs:
        check(kernel(**env, config=config), default.double(), torch.float32, f"{index} {config}")


# ---- mathlib: the functions Triton lacks, accurate at every magnitude ---------------------

@pytest.mark.parametrize("op", ["expm1", "log1p", "tanh", "sinh", "asinh", "atanh", "atan", "asin", "cbrt"])
def test_mathlib_is_accurate_near_zero_and_at_extremes(op):
    tiny = torch.logspace(-30, 0, 40)
    x = torch.cat([tiny, -tiny, torch.tensor([0.0, -0.0, 10.0, 60.0, 100.0, 1e30, float("inf")])])
    if op == "log1p":
        x = x[x > -1]
    out = K.generate_elementwise(Term(op, (Term.input("x", x.shape),)))(x=x)
    ref = ops.OPS[op].impl(x.double())
    assert torch.equal(out.isinf(), ops.OPS[op].impl(x).isinf())  # overflows where torch does
    assert torch.equal(out[x == 0].signbit(), x[x == 0].signbit())  # f(+-0) = +-0
    finite = ref.abs() < torch.finfo(torch.float32).max
    rel = ((out.double() - ref).abs() / ref.abs())[finite].nan_to_num(0.0)  # 0 / 0 at x = 0
    print(f"{op}: max relative error {rel.max().item():.3g}")
    assert (rel < 1e-6).all()  # a few float32 ulps


def test_a_generated_round_takes_ties_to_even_and_keeps_the_sign_of_zero():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, -0.3, 0.49999997, 2.0 ** 23 + 1, -(2.0 ** 24), 7.5, math.inf, math.nan])
    out = K.generate_elementwise(Term("round", (Term.input("x", x.shape),)))(x=x)
    assert torch.equal(out.nan_to_num(7.0), torch.round(x).nan_to_num(7.0)) and torch.equal(out.signbit(), torch.round(x).signbit())


def test_a_generated_power_of_a_constant_base():
    """2 ** y, (-1) ** y and (-inf) ** y: the base a number, not a block (found by a random region: an AttributeError);
    (-inf) ** 1.86 is inf, as C's pow (random region 15 in float16, once atanh had a template: it was NaN)."""
    y = torch.tensor([[-3.0, -0.5, 0.0, 0.5, 1.0, 2.0, 10.0, 200.0, 1.86, float("inf"), float("nan")]])
    for base in (2.0, -1.0, -math.inf):
        out = K.generate_elementwise(Term("pow", (Term.const(base), Term.input("y", y.shape))))(y=y)
        torch.testing.assert_close(out, torch.pow(base, y), equal_nan=True, rtol=2 ** -23, atol=0)


@pytest.mark.parametrize("exponent", [1 / 3, 0.5, 2.5, -1.7, 3.0, 7.0, -2.0])
def test_a_generated_power_rounds_once_at_every_magnitude(exponent):
    """a ** b from exp(b log a) in float32 errs by |b log a| ulps (30 at 1e5 ** (1/3), enough to fail
    the validation of a cube-root difference); computed in float64 and rounded once, it is within an ulp
    of torch's, and overflows, underflows and keeps signs where torch does."""
    x = torch.logspace(-30, 30, 241)
    x = torch.cat([x, -x] if exponent == round(exponent) else [x])
    out = K.generate_elementwise(Term("pow", (Term.input("x", x.shape), Term.const(exponent))))(x=x)
    ref = torch.pow(x.double(), exponent)
    assert torch.equal(out.isinf(), torch.pow(x, exponent).isinf()) and torch.equal(out.signbit(), ref.signbit())
    normal = (ref.abs() >= torch.finfo(torch.float32).tiny) & (ref.abs() <= torch.finfo(torch.float32).max)
    assert (((out.double() - ref).abs() / ref.abs())[normal] <= 2.0 ** -23).all()

# ---- the elementwise generator ------------------------------------------------------------

def _positive(shape):
    return torch.rand(*shape, dtype=torch.float64) * 3 + 0.1


DOMAINS = {"log": _positive, "sqrt": _positive, "rsqrt": _positive, "log2": _positive, "log10": _positive,
           "log1p": lambda shape: torch.rand(*shape, dtype=torch.float64) * 3 - 0.9,
           "acosh": lambda shape: 1 + torch.rand(*shape, dtype=torch.float64).square() * 30,
           "atanh": lambda shape: torch.rand(*shape, dtype=torch.float64) * 1.98 - 0.99}
DOMAINS["asin"] = DOMAINS["acos"] = DOMAINS["atanh"]


def _unary(op):
    x = Term.input("x", (3, 1025))
    return Term(op, (x,), {"gelu": ("tanh",), "swish": (1.702,)}.get(op, ()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", [op for op in codegen.TEMPLATES if ops.OPS[op].arity == 1 and op not in ("cast", *codegen.STATS,
                                                                                              *ops.COMPARISONS)])
def test_generated_unary_op(op, dtype):
    x = DOMAINS.get(op, lambda shape: torch.randn(*shape, dtype=torch.float64) * 2)((3, 1025))
    x = x.to(dtype)
    term = _unary(op)
    ref, = evaluate([term], {"x": x}, reference=True)
    check(K.generate_elementwise(term)(x=x), ref, dtype, f"generated {op}")


@pytest.mark.parametrize("op, exponent", [("pow", 2.0), ("pow", 3.0), ("pow", 0.5), ("pow", 0.0),
                                          ("maximum", 0.25), ("minimum", 0.25), ("div", 3.0),
                                          ("sub", 1.5)])
def test_generated_binary_op_with_constant(op, exponent):
    x = torch.randn(2, 33)
    if exponent == 0.5:
        x = x.abs()
    x[0, 0] = float("nan") if op in ("maximum", "minimum") else x[0, 0]  # torch keeps NaN
    term = Term(op, (Term.input("x", (2, 33)), Term.const(exponent)))
    ref, = evaluate([term], {"x": x}, reference=True)
    check(K.generate_elementwise(term)(x=x), ref, torch.float32, f"generated {op} {exponent}")


def test_generated_logaddexp_and_hypot_keep_the_op_tables_values_at_the_extremes():
    """log(e^a + e^b) and sqrt(a^2 + b^2) with no overflow or underflow in between (1e30, 1e-40 give theirs), the larger
    where it is infinite, NaN where an operand is (hypot too: ops.hypot, not IEEE's inf); a constant operand too."""
    i, n = math.inf, math.nan
    a = torch.tensor([i, i, -i, -i, n, i, 0.0, -0.0, 3.0, 1e30, 1e-30, 1e-40, 2.0, -5.0, 0.5, -88.0, 3e38])
    b = torch.tensor([i, -i, -i, n, i, n, 0.0, 0.0, -4.0, 1e30, 1e-30, 1e-40, 2.0, 5.0, -0.5, -87.0, 3e38])
    for op in ("logaddexp", "hypot"):
        for term, env in [(Term(op, (Term.input("a", a.shape), Term.input("b", b.shape))), {"a": a, "b": b}),
                          (Term(op, (Term.input("a", a.shape), Term.const(-0.75))), {"a": a})]:
            out, (ref,) = K.generate_elementwise(term)(**env).double(), evaluate([term], {k: v.double() for k, v in env.items()})
            finite, beyond = ref.abs() <= torch.finfo(torch.float32).max, ref.abs() > torch.finfo(torch.float32).max
            assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), beyond) and \
                torch.equal(out[beyond].sign(), ref[beyond].sign()), pretty(term)
            torch.testing.assert_close(out[finite], ref[finite], rtol=4 * 2.0 ** -23, atol=2.0 ** -148, msg=pretty(term))


def test_a_generated_copysign_takes_the_sign_bit_of_zeros_infinities_and_a_scalar():
    """|a| with b's sign bit, as torch.copysign: -0.0 is negative, inf keeps its magnitude, a NaN magnitude stays NaN;
    a constant sign operand (a scalar argument, not a block) too."""
    a = torch.tensor([1.5, -2.0, 0.0, -0.0, math.inf, -math.inf, math.nan, 3.0])
    b = torch.tensor([-0.0, 0.0, -1.0, 2.0, -math.inf, math.inf, -1.0, -1e-45])
    x, y = Term.input("a", a.shape), Term.input("b", b.shape)

    def same(u, v):  # values, NaN where NaN, and the sign of each number (of zeros too)
        signs = (u.signbit() | u.isnan(), v.signbit() | v.isnan())
        return torch.equal(u.nan_to_num(7.0), v.nan_to_num(7.0)) and torch.equal(*signs)
    assert same(K.generate_elementwise(Term("copysign", (x, y)))(a=a, b=b), torch.copysign(a, b))
    for c in (-0.0, 0.0, -3.0):
        assert same(K.generate_elementwise(Term("copysign", (x, Term.const(c))))(a=a), torch.copysign(a, torch.tensor(c)))


def test_generated_masks_compare_and_select_as_torch_at_the_extremes():
    """A mask (a comparison, isnan, logical_not, of floats or of a bool input) is 1.0 or 0.0 inside a kernel and a bool
    at its root; where() selects by it: NaN compares false, -0.0 keeps its sign, inf compares as a number."""
    x = torch.tensor([[0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 1e-45, 3.4e38, -2.0]])
    y = torch.tensor([[0.0, 0.0, 2.0, -2.0, math.inf, 0.0, 1.0, 0.0, math.inf, math.nan]])
    env = {"x": x, "y": y, "m": x > 0}
    X, Y, M = Term.input("x", x.shape), Term.input("y", y.shape), Term.input("m", x.shape, "bool")
    for term in [Term("less", (X, Y)), Term("less", (X, Term.const(0.5))), Term("isnan", (X,)),
                 Term("logical_not", (X,)), Term("logical_not", (M,)), Term("where", (Term("less", (X, Y)), X, Y)),
                 Term("where", (M, Term("neg", (X,)), Term.const(-0.0))),
                 Term("where", (Term("logical_not", (Term("isnan", (Y,)),)), Term("mul", (M, X)), X))]:
        kernel = K.generate_elementwise(term)
        out, (ref,) = kernel(*(env[n] for n in kernel.program.inputs)), evaluate([term], env)
        assert out.dtype == ref.dtype, pretty(term)
        out, ref = out.double(), ref.double()  # a mask's 1.0 or 0.0
        assert torch.equal(out.nan_to_num(7.0), ref.nan_to_num(7.0)) and torch.equal(out.signbit(), ref.signbit()), \
            pretty(term)


def test_a_generated_cast_rounds_as_torch_does_at_the_extremes():
    """A cast rounds to nearest even: ties, the overflow to inf past max, subnormals, -0.0 and NaN
    give torch's bits, and a broadcast (C,) operand reads a[j] at every row."""
    info = torch.finfo(torch.float16)
    big = [info.max, 65519.0, 65520.0, 3.4e38, math.inf, math.nan, 0.0, -0.0, 2.0 ** -25, 3 * 2.0 ** -26]
    x = torch.tensor([big, [-v for v in big], [1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 2.0 ** -24 / 3, 1e-8, 0.1,
                                               info.smallest_normal * 0.999, 1.0, 2.0, 3.0, 4.0]])
    a = torch.tensor([1.0] * 8 + [0.5, 1.5])
    term = Term("cast", (Term("mul", (Term.input("x", x.shape), Term.input("a", a.shape))),), ("float16",))
    out = K.generate_elementwise(term)(x=x, a=a)
    assert out.dtype == torch.float16 and torch.equal(out.view(torch.int16), (x * a).half().view(torch.int16))


def _mlp_like():
    """A DAG with shared subterms over two inputs: gelu(x * y + sigmoid(x)) / (1 + exp(-|x|))."""
    x, y = Term.input("x", (5, 7)), Term.input("y", (5, 7))
    sig = Term("sigmoid", (x,))
    inner = Term("gelu", (Term("add", (Term("mul", (x, y)), sig)),), ("none",))
    denom = Term("add", (Term.const(1.0), Term("exp", (Term("neg", (Term("abs", (x,)),)),))))
    return Term("div", (Term("add", (inner, sig)), denom))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("root", [None, ("sum", True), ("max", False), ("mean", False)])
def test_generated_dag_and_root_reductions(root, dtype):
    term = _mlp_like()
    if root:
        term = Term(root[0], (term,), (-1, root[1]))
    env = {"x": randn(5, 7, dtype=dtype), "y": randn(5, 7, dtype=dtype)}
    ref, = evaluate([term], env, reference=True)
    check(K.generate_elementwise(term)(**env), ref, dtype, f"generated dag root={root}")


@pytest.mark.parametrize("n", [1, 7, 1025])
@pytest.mark.parametrize("reduction", ["sum", "max", "mean", "softmax"])
def test_generated_reduction_row_lengths(reduction, n):
    """Rows of one block and of several, negated: with a NaN in the masked last block when n = 1025,
    a +inf (softmax: NaN there and 0 beside it) and a row of -inf only (softmax: NaN, as torch's)."""
    x = torch.randn(4, n)
    x[1, n - 1], x[2, n // 2], x[3] = math.nan, -math.inf, math.inf
    attrs = (-1,) if reduction == "softmax" else (-1, True)
    term = Term(reduction, (Term("neg", (Term.input("x", (4, n)),)),), attrs)
    ref, = evaluate([term], {"x": x}, reference=True)
    check(K.generate_elementwise(term)(x=x), ref, torch.float32, f"generated {reduction} n={n}")


def test_a_generated_kernel_runs_the_ops_torch_kernels_where_autograd_records():
    """A generated kernel has no backward: with an input that requires grad, the term runs on the
    ops' torch kernels, and the gradient flows."""
    x, y = randn(3, 5).requires_grad_(), randn(3, 5)
    kernel = K.generate_elementwise(Term("mul", (Term("tanh", (Term.input("x", (3, 5)),)), Term.input("y", (3, 5)))))
    kernel(x=x, y=y).sum().backward()
    torch.testing.assert_close(x.grad, (1 - torch.tanh(x.detach()) ** 2) * y)
    with torch.no_grad():
        check(kernel(x=x, y=y), torch.tanh(x.double()) * y.double(), torch.float32, "no grad")


X = Term.input("x", (2, 3))


@pytest.mark.parametrize("term, message", [
    (Term("matmul", (X, X)), "'matmul'"),
    (Term("exp", (Term("softmax", (Term("rms_norm", (X, Term.const(1.0)), (1e-6,)),), (-1,)),)),
     "'softmax'.*one row op, not also rms_norm"),
    (Term("softmax", (X,), (0,)), "'softmax'.*last axis"),
    (Term("exp", (Term("sum", (X,), (-1, True)),)), "'sum'.*only at the root"),
    (Term("sum", (X,), (0, False)), "'sum'.*last axis"),
    (Term("gelu", (X,), ("erf",)), "'gelu'.*approximate"),
    (Term("add", (Term.const(1.0), Term.const(2.0))), "at least one input"),
    (Term("mul", (X, Term("softmax", (Term.input("y", (2, 1)),), (-1,)))), "'softmax'.*broadcast operand"),
    (Term("add", (X, Term("softmax", (Term.const(1.0),), (-1,)))), "'softmax'.*broadcast operand"),
])
def test_generator_refuses_with_a_clear_message(term, message):
    with pytest.raises(ValueError, match=message):
        K.generate_elementwise(term)


def test_generator_reuses_the_kernel_of_a_structurally_equal_term(tmp_path, monkeypatch):
    monkeypatch.setenv("EGRAPH_OPT_CACHE", str(tmp_path))

    def build(name, value):  # fresh Term objects each call: equal structure, not identity
        a = Term.input(name, (4, 9))
        return Term("mul", (Term("tanh", (a,)), Term("add", (a, Term.const(value)))))

    first, second = K.generate_elementwise(build("x", 2.0)), K.generate_elementwise(build("y", 3.0))
    other = K.generate_elementwise(Term("sin", (Term.input("x", (4, 9)),)))
    assert first.kernel is second.kernel and other.kernel is not first.kernel
    assert len(list((tmp_path / "triton").glob("*.py"))) == 2
    x = torch.randn(4, 9)
    check(second(y=x), torch.tanh(x.double()) * (x.double() + 3.0), torch.float32, "cache")
    with pytest.raises(TypeError, match="expected inputs"):
        second(x=x)


# ---- the package without Triton -----------------------------------------------------------

def test_available_is_false_without_a_cuda_device():
    assert K.available() == torch.cuda.is_available()


def test_package_imports_without_triton_and_explains():
    code = ("import sys, logging; logging.basicConfig(); sys.modules['triton'] = None\n"
            "import egraph_opt.kernels.triton as K\n"
            "assert not K.available() and not K.available()\n"
            "try:\n    K.softmax(None, -1)\nexcept RuntimeError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "'softmax' needs the triton package" in done.stdout
    assert done.stderr.count("triton is not installed") == 1


@pytest.mark.parametrize("shard", ["0/2", "1/2"])  # two halves, which two test workers compile side by side
def test_every_triton_kernel_compiles_for_a_hopper_gpu(tmp_path, shard):
    """The interpreter runs what the compiler refuses (a kernel reading a global float fell back on
    an H200 with a CompilationError): every launch of every registry kernel, in float16, bfloat16
    and float32, compiles for sm_90 here, without a GPU (tests/triton_compiles.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"], env["TRITON_COMPILES_SHARD"] = str(tmp_path), shard
    script = os.path.join(os.path.dirname(__file__), "triton_compiles.py")
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "FAILED" not in done.stdout, done.stdout
    launches = int(done.stdout.split(" launches compiled")[0].split()[-1])
    assert launches >= 40, done.stdout
    assert int(done.stdout.split(" in shard")[0].split("(")[-1]) > launches // 4, done.stdout  # a share, not none


def _random_region(seed: int, dtype: str):
    """The fuzzer's program of ``seed`` in ``dtype``, each op rounding to it (a cast) as the backend's regions do,
    and its inputs (extremes mixed in for some seeds)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    import fuzz
    wide, ranges, kind = fuzz.drawn(seed)
    env = {k: v.to(getattr(torch, dtype)) for k, v in fuzz.inputs(wide, ranges, seed, kind).items()}
    made = {}
    for t in postorder([fuzz.from_sexpr(fuzz.sexpr(wide), fuzz.input_shapes(wide), dtype)]):
        u = Term(t.op, tuple(made[id(a)] for a in t.args), t.attrs) if t.args else t
        made[id(t)] = Term("cast", (u,), (dtype,)) if t.args and dtype != "float32" else u
    return made[id(t)], wide, env


#: (seeds, dtype, ulps allowed beyond 4x torch's error): float16 regions round each op as torch's kernels do
RANDOM_REGIONS = [(range(0, 150), "float32", 64), (range(150, 300), "float32", 64), (range(0, 150), "float16", 8)]


@pytest.mark.parametrize("seeds, dtype, ulps", RANDOM_REGIONS, ids=["float32-0", "float32-150", "float16-0"])
def test_random_regions_compute_what_torch_kernels_do(seeds, dtype, ulps):
    """Differential: the fuzzer's random programs that the generator takes (about one in four) compute
    what torch's kernels do, non-finite where they are, else within 4x their error against float64 and
    the change an ulp of input makes (cos(exp(x)^2)), plus ``ulps`` of the larger of the value and 1 (mathlib's
    expm1, a few ulps, then exp of 15). It found a power of a number that raised, (-1) ** inf = NaN, (-0) ** -1
    = +inf, and a softmax of a broadcast (3, 1) value over 4."""
    generated, eps = 0, torch.finfo(getattr(torch, dtype)).eps
    for seed in seeds:
        term, wide, env = _random_region(seed, dtype)
        try:
            kernel = K.generate_elementwise(term)
        except ValueError:  # an op without a template, a reduction inside, no input
            continue
        out, (ref,) = kernel(**env).double(), evaluate([term], env)
        truth, = evaluate([wide], {k: v.double() for k, v in env.items()})
        nudged, = evaluate([wide], {k: v.double() * (1 + 2 * eps) for k, v in env.items()})  # conditioning
        ref, generated = ref.double(), generated + 1
        assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf() & (out > 0), ref.isinf() & (ref > 0)) \
            and torch.equal(out.isinf() & (out < 0), ref.isinf() & (ref < 0)), (seed, pretty(term))
        close = (out - truth).abs() <= 4 * ((ref - truth).abs() + (nudged - truth).abs().nan_to_num(0.0)) + \
            ulps * eps * truth.abs().clamp_min(1)  # (-3.0 + an ulp) ** y is NaN: no conditioning read
        assert close[ref.isfinite() & truth.isfinite()].all(), (seed, pretty(term))
    assert generated >= 30  # the test tries what it says
