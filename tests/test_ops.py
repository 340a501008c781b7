"""Every op: captured from the torch spelling users write, evaluated by the reference evaluator,
compared with torch eager in float64; composite ops against their definitions in primitives."""
import math

import pytest
import torch
import torch.nn.functional as F

from egraph_opt.frontends.capture import capture
from egraph_opt.kernels.torch_ops import TORCH
from egraph_opt.lang.ops import OPS
from egraph_opt.lang.program import leaves
from egraph_opt.lang.term import Term, postorder
from egraph_opt.lang.term import evaluate as _evaluate


def evaluate(roots, env, **options):
    """As a plan runs them: with the torch kernels."""
    return _evaluate(roots, env, kernels=TORCH, **options)


R = lambda *s: torch.randn(*s)  # noqa: E731
P = lambda *s: torch.rand(*s) + 0.5  # noqa: E731  positive
IDX = torch.tensor([[0, 2, 1], [1, 1, 0]])
TGT = torch.tensor([0, 4, -100, 1])  # class indices of 5 classes, one ignored

#  op checked       torch spelling                                           example inputs
CASES = [
    ("add",          lambda x, y: x + y + 2.0,                                 (R(2, 3), R(3))),
    ("sub",          lambda x, y: 1.0 - torch.sub(x, y),                       (R(2, 3), R(2, 3))),
    ("mul",          lambda x, y: x.mul(y) * 3,                                (R(2, 3), R(2, 1))),
    ("div",          lambda x, y: x / y / 2,                                   (R(2, 3), P(2, 3))),
    ("pow",          lambda x: x ** 2.5 + torch.pow(x, 2),                     (P(4),)),
    ("maximum",      lambda x, y: torch.maximum(x, y) + x.clamp(min=0.125),    (R(4), R(4))),  # exact in float32, as constants are captured
    ("minimum",      lambda x, y: torch.minimum(x, y) + torch.clamp(x, max=0), (R(4), R(4))),
    ("where",        lambda m, x, y: torch.where(m, x, y) + x.masked_fill(m, -1.0), (R(5) > 0, R(5), R(5))),
    ("less",         lambda x, y: torch.where(x < y, x, y) + torch.where(x > 0.5, 1.0, y), (R(4), R(4))),
    ("isnan",        lambda x: torch.where(torch.isnan(x.log()), 0.0, x) + x.isnan(), (R(5),)),
    ("logical_not",  lambda m, x: torch.where(torch.logical_not(m), x, 0.0),    (R(5) > 0, R(5))),
    ("neg",          lambda x: -x,                                             (R(3),)),
    ("prod",         lambda x: x.prod(-1) + torch.prod(x, 0, keepdim=True).sum() + x.prod(),  (R(3, 4),)),
    ("argmax",       lambda x: x[:, 0] * x.argmax(-1) + (x[0] * torch.argmax(x, 0, keepdim=True)).sum() + x.argmax(),
                                                                               (R(3, 4),)),
    ("argmin",       lambda x: x[:, 0] * x.argmin(1) + torch.argmin(x),        (R(3, 4),)),
    ("floor",        lambda x: torch.floor(x * 4) + (x * 4).floor(),           (R(5),)),
    ("ceil",         lambda x: torch.ceil(x * 4),                              (R(5),)),
    ("round",        lambda x: torch.round(x * 4) + torch.round(x * 0 + 2.5),   (R(5),)),  # half to even
    ("trunc",        lambda x: torch.trunc(x * 4),                             (R(5),)),
    ("asin",         lambda x: torch.asin(x * 0.25),                           (R(5),)),
    ("acos",         lambda x: torch.acos(x * 0.25),                           (R(5),)),
    ("sinh",         lambda x: torch.sinh(x),                                  (R(5),)),
    ("cosh",         lambda x: torch.cosh(x),                                  (R(5),)),
    ("log2",         lambda x: torch.log2(x),                                  (P(5),)),
    ("log10",        lambda x: torch.log10(x),                                 (P(5),)),
    ("fmod",         lambda x, y: torch.fmod(x * 4, y) + torch.fmod(x, 0.25),  (R(5), P(5))),
    ("copysign",     lambda x, y: torch.copysign(x, y) + (x * 4).copysign(y - 0.5),  (R(5), R(5))),
    ("remainder",    lambda x, y: (x * 4) % y + torch.remainder(x, 0.25),      (R(5), P(5))),
    ("exp",          lambda x: torch.exp(x) + x.exp(),                         (R(3),)),
    ("log",          lambda x: torch.log(x),                                   (P(3),)),
    ("log1p",        lambda x: torch.log1p(x),                                 (P(3),)),
    ("expm1",        lambda x: x.expm1(),                                      (R(3),)),
    ("sqrt",         lambda x: x.sqrt(),                                       (P(3),)),
    ("rsqrt",        lambda x: torch.rsqrt(x),                                 (P(3),)),
    ("abs",          lambda x: x.abs(),                                        (R(3),)),
    ("sin",          lambda x: torch.sin(x),                                   (R(3),)),
    ("cos",          lambda x: torch.cos(x),                                   (R(3),)),
    ("tanh",         lambda x: F.tanh(x),                                      (R(3),)),
    ("sigmoid",      lambda x: torch.sigmoid(x) + F.silu(x),                   (R(3),)),
    ("relu",         lambda x: F.relu(x) + torch.relu(x),                      (R(3),)),
    ("erf",          lambda x: torch.erf(x),                                   (R(3),)),
    ("silu",         lambda x: F.silu(x) * 2.0,                                (R(3),)),
    ("gelu",         lambda x: F.gelu(x) + F.gelu(x, approximate="tanh"),      (R(3),)),
    ("tan",          lambda x: torch.tan(x) + x.tan(),                         (R(3),)),
    ("atan",         lambda x: torch.atan(x) + x.atan(),                       (R(3),)),
    ("atan2",        lambda y, x: torch.atan2(y, x) + y.atan2(x * 2),          (R(5), R(5))),
    ("hypot",        lambda x, y: torch.hypot(x, y) + x.hypot(y * 3),          (R(5), R(5))),
    ("asinh",        lambda x: torch.asinh(x),                                 (R(3),)),
    ("acosh",        lambda x: torch.acosh(x),                                 (P(3) + 1,)),
    ("atanh",        lambda x: torch.atanh(x),                                 (torch.rand(3) - 0.5,)),
    ("sum",          lambda x: x.sum(-1, keepdim=True) + x.sum((0, 2)).sum(),  (R(2, 3, 4),)),
    ("max",          lambda x: x.amax(1) + torch.max(x, -1).values + x.max(-1, keepdim=True)[0].sum(), (R(3, 3),)),
    ("mean",         lambda x: x.mean(0) + torch.mean(x),                      (R(3, 2),)),
    ("var",          lambda x: x.var(-1) + torch.var(x, 0, unbiased=False),    (R(3, 3),)),
    ("matmul",       lambda a, b: a @ b + torch.bmm(a, b),                     (R(2, 3, 4), R(2, 4, 3))),
    ("transpose",    lambda x: x.transpose(0, 1) + x.permute(0, 2, 1).transpose(1, 2).transpose(0, 1), (R(3, 3, 2),)),
    ("permute",      lambda x: x.permute(2, 0, 1),                             (R(2, 3, 4),)),
    ("reshape",      lambda x: x.reshape(6, -1) + x.view(6, 4) + x.flatten(1).unsqueeze(0).squeeze(0).reshape(6, 4), (R(2, 3, 4),)),
    ("expand",       lambda x: x.expand(3, 4),                                 (R(1, 4),)),
    ("gather",       lambda x, i: torch.gather(x, 1, i),                       (R(2, 3), IDX)),
    ("index_select", lambda x, i: x.index_select(0, i),                        (R(3, 4), IDX[0])),
    ("slice",        lambda x: x[:, 1:3] + x[:, ::2],                          (R(3, 4),)),
    ("concat",       lambda x, y: torch.cat([x, y, x], dim=-1),                (R(2, 3), R(2, 1))),
    ("cast",         lambda x: x.to(torch.float16).float() + x.double().float(), (R(3),)),
    ("softmax",      lambda x: torch.softmax(x, -1) + F.softmax(x, dim=0) + x.softmax(1), (R(3, 3),)),
    ("log_softmax",  lambda x: F.log_softmax(x, dim=-1),                       (R(2, 5),)),
    ("logsumexp",    lambda x: torch.logsumexp(x, -1) + x.logsumexp(0, keepdim=True).sum(), (R(3, 3),)),
    ("softplus",     lambda x: F.softplus(x) + F.softplus(x * 30),             (R(6),)),
    ("logaddexp",    lambda a, b: torch.logaddexp(a, b) + a.logaddexp(b * 40),    (R(4), R(4))),
    ("layer_norm",   lambda x, w, b: F.layer_norm(x, (4,), w, b, 1e-6),        (R(2, 3, 4), R(4), R(4))),
    ("rms_norm",     lambda x, w: F.rms_norm(x, (4,), w, 1e-6) + F.rms_norm(x, [4], None, 1e-5), (R(2, 3, 4), R(4))),
    ("sdpa",         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (R(2, 5, 4), R(2, 5, 4), R(2, 5, 3))),
    ("linear",       lambda x, w, b: F.linear(x, w, b) + F.linear(x, w),       (R(2, 4), R(3, 4), R(3))),
    ("conv2d",       lambda x, w, b: F.conv2d(x, w, b, 2, 1) + F.conv2d(x, w, None, 2, (1, 1)),
                                                                               (R(2, 3, 9, 9), R(4, 3, 3, 3), R(4))),
    ("max_pool2d",   lambda x: F.max_pool2d(x, 2) + F.max_pool2d(x, 3, 2, 1) + torch.max_pool2d(x, (2,)),
                                                                               (R(2, 3, 8, 8),)),
    ("nll_loss",     lambda x, t: F.nll_loss(F.log_softmax(x, -1), t) + F.nll_loss(x, t, reduction="sum"),
                                                                               (R(4, 5), TGT)),
    ("cross_entropy", lambda x, t: F.cross_entropy(x, t) + F.cross_entropy(x, t, reduction="none")[:2],
                                                                               (R(4, 5), TGT)),
    ("batch_norm",   lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, False, 0.1, 1e-3),
                                                                               (R(2, 3, 4, 4), R(3), P(3), R(3), R(3))),
]


@pytest.mark.parametrize("op,fn,inputs", CASES, ids=[c[0] for c in CASES])
def test_reference_evaluator_matches_torch(op, fn, inputs):
    program, _ = capture(fn, inputs)
    assert not program.opaque, [c.describe() for c in program.opaque.values()]
    ops = {t.op for t in postorder(program.roots())}
    assert op in ops
    env = {t.attrs[0]: x for t, x in zip(program.inputs, inputs)}
    outputs = [x for x in leaves(program.outputs)]
    torch.testing.assert_close(evaluate(outputs, env)[0], fn(*inputs), rtol=1e-6, atol=1e-6)
    (got,) = evaluate(outputs, env, reference=True)
    wide = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    # the reference treats float casts as exact: then only float16 rounding separates the two
    tol = 1e-3 if "cast" in ops else 1e-10
    torch.testing.assert_close(got, fn(*wide).double(), rtol=tol, atol=tol)


def test_every_op_has_a_case():
    covered = {c[0] for c in CASES} | {c.op for c, _ in DEFINITIONS + FUSED}
    covered |= {name for name, op in OPS.items() if op.mesh}  # tests/test_sharding.py: each device
    assert {name for name, op in OPS.items() if not op.is_leaf} <= covered


x = Term.input("x", (3, 5), "float64")
SHIFTED = Term("sub", (x, Term("max", (x,), (-1, True))))
DEFINITIONS = [  # composite term, its definition in primitive ops
    (Term("softmax", (x,), (-1,)),
     Term("div", (Term("exp", (SHIFTED,)), Term("sum", (Term("exp", (SHIFTED,)),), (-1, True))))),
    (Term("logsumexp", (x,), (-1, False)), Term("log", (Term("sum", (Term("exp", (x,)),), (-1, False)),))),
    (Term("log_softmax", (x,), (-1,)),
     Term("sub", (x, Term("log", (Term("sum", (Term("exp", (x,)),), (-1, True)),)))),),
]


Q, K, V, B = (Term.input(n, (2, 4, 6), "float64") for n in "qkvb")
W, BIAS = Term.input("w", (5, 6), "float64"), Term.input("bias", (5,), "float64")
FUSED = [  # ops only rewrites create, against their definitions
    (Term("linear_act", (Q, W, BIAS), ("relu",)), Term("relu", (Term("linear", (Q, W, BIAS)),))),
    (Term("linear_act", (Q, W, BIAS), ("gelu_tanh",)),
     Term("gelu", (Term("linear", (Q, W, BIAS)),), ("tanh",))),
    (Term("sdpa_masked", (Q, K, V, Term("matmul", (B, Term("transpose", (B,), (-2, -1))))), (0.4,)),
     Term("matmul", (Term("softmax", (Term("add", (Term("mul", (Term("matmul", (Q, Term(
         "transpose", (K,), (-2, -1)))), Term.const(0.4))), Term("matmul", (B, Term(
             "transpose", (B,), (-2, -1)))))),), (-1,)), V))),
    *((Term("compensated_sum", (Q,), (axis, keep)), Term("sum", (Q,), (axis, keep)))
      for axis, keep in ((-1, True), (-2, False), (-3, True))),
    (Term("cbrt", (Q,)), Term("mul", (Term("div", (Q, Term("abs", (Q,)))),
                                       Term("pow", (Term("abs", (Q,)), Term.const(1 / 3)))))),
    *((Term("sdpa_filled", (Q, K, V, Term.input("keep")), (0.4, fill)),  # a dead row: mean of v
       Term("matmul", (Term("softmax", (Term("where", (Term.input("keep"), Term("mul", (Term("matmul", (
           Q, Term("transpose", (K,), (-2, -1)))), Term.const(0.4))), Term.const(fill))),), (-1,)), V)))
      for fill in (-3.4028234663852886e38, -1e4, 2.0)),
    *((Term("sdpa_filled_biased", (Q, K, V, Term.input("keep"), bias), (0.4, fill)),  # MPT's alibi, then the fill
       Term("matmul", (Term("softmax", (Term("where", (Term.input("keep"), Term("add", (Term("mul", (Term("matmul", (
           Q, Term("transpose", (K,), (-2, -1)))), Term.const(0.4))), bias)), Term.const(fill))),), (-1,)), V)))
      for fill in (-3.4028234663852886e38, 2.0) for bias in (Term.input("mask"), Term("matmul", (B, Term("transpose", (B,), (-2, -1)))))),
    *((Term("sdpa_filled_then_biased", (Q, K, V, Term.input("keep"), bias), (0.4, fill)),  # GPT-NeoX: the fill,
       Term("matmul", (Term("softmax", (Term("add", (Term("where", (Term.input("keep"), Term("mul", (Term(  # then
           "matmul", (Q, Term("transpose", (K,), (-2, -1)))), Term.const(0.4))), Term.const(fill))), bias)),),  # the
                                        (-1,)), V)))  # padding mask: a key at -inf, or sums that reach
      for fill in (-3.4028234663852886e38, -1e4, 2.0)  # float64's max, or a bias of the scores' size
      for bias in (Term.input("pad"), Term.input("huge"), Term("matmul", (B, Term("transpose", (B,), (-2, -1)))))),
    *((Term("sdpa_guarded", (Q, K, V, bias), (0.4,)),  # a row every key masks: 0
       Term("matmul", (Term("where", (Term("isnan", (w,)), Term.const(0.0), w)), V)))
      for bias in (Term.input("mask"), Term("matmul", (B, Term("transpose", (B,), (-2, -1)))))
      for w in [Term("softmax", (Term("add", (Term("mul", (Term("matmul", (Q, Term("transpose", (K,), (-2, -1)))),
                                                        Term.const(0.4))), bias)),), (-1,))]),
    *((Term("sdpa_floored", (Q, K, V, Term.input("mask")), (0.4, floor)),  # a row every key masks: floor's
       Term("matmul", (Term("softmax", (Term("maximum", (Term("add", (Term("mul", (Term("matmul", (Q, Term(
           "transpose", (K,), (-2, -1)))), Term.const(0.4))), Term.input("mask"))), Term.const(floor))),), (-1,)), V)))
      for floor in (-1.7976931348623157e308, -1e4, 2.0)),
    (Term("rms_norm", (Q, Term.input("w6"),), (1e-6,)),  # x * rsqrt(mean(x * x) + eps) * w
     Term("mul", (Term("mul", (Q, Term("rsqrt", (Term("add", (Term("mean", (Term("mul", (Q, Q)),), (-1, True)),
                                                            Term.const(1e-6))),)))), Term.input("w6")))),
    (Term("swish", (Q,), (1.702,)), Term("mul", (Q, Term("sigmoid", (Term("mul", (Q, Term.const(1.702))),))))),
    (Term("geglu", (Q, K), ("tanh",)), Term("mul", (Term("gelu", (Q,), ("tanh",)), K))),
    *((Term("rotary", (Q, K, sin)), Term("add", (Term("mul", (Q, K)), Term("mul", (Term("concat", (
        Term("neg", (Term("slice", (Q,), (-1, 3, 6, 1)),)), Term("slice", (Q,), (-1, 0, 3, 1))), (-1,)), sin)))))
      for sin in (V, Term.input("w6"))),  # a sin table smaller than x takes the sign itself
    *((Term("linear_add", (Q, W, BIAS, r)), Term("add", (Term("linear", (Q, W, BIAS)), r)))
      for r in (Term("linear", (Q, W, BIAS)), BIAS)),  # a residual of the output's shape, or broadcast
    (Term("linear_scaled", (Q, W, BIAS), (0.25,)), Term("mul", (Term("linear", (Q, W, BIAS)), Term.const(0.25)))),
    (Term("layer_norm", (Q, Term.const(1.0), Term.const(0.0)), (1e-5,)),
     Term("layer_norm", (Q, Term.input("ones", (6,), "float64"), Term.input("zeros", (6,), "float64")),
          (1e-5,))),
]


@pytest.mark.parametrize("fused,definition", FUSED, ids=lambda t: getattr(t, "op", ""))
def test_fused_ops_equal_their_definitions(fused, definition):
    g = torch.Generator().manual_seed(2)
    env = {n: torch.randn(2, 4, 6, generator=g, dtype=torch.float64) for n in "qkvb"}
    env.update(w=torch.randn(5, 6, generator=g, dtype=torch.float64),
               bias=torch.randn(5, generator=g, dtype=torch.float64),
               w6=torch.randn(6, generator=g, dtype=torch.float64),
               keep=torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool),
               mask=torch.tensor([[0, -math.inf] * 2, [-math.inf] * 4, [0.0] * 4, [-math.inf, 0] * 2],
                                 dtype=torch.float64),
               ones=torch.ones(6, dtype=torch.float64), zeros=torch.zeros(6, dtype=torch.float64),
               huge=torch.tensor([0.0, -1.7976931348623157e308, 0.0, 1e300], dtype=torch.float64),
               pad=torch.tensor([0.0, -math.inf, 0.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(*evaluate([fused, definition], env), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("composite,definition", DEFINITIONS, ids=lambda t: getattr(t, "op", ""))
def test_composites_equal_their_definitions(composite, definition):
    env = {"x": torch.randn(3, 5, dtype=torch.float64) * 3}
    torch.testing.assert_close(*evaluate([composite, definition], env), rtol=1e-12, atol=1e-12)


def test_layer_norm_attention_linear_definitions():
    g = torch.Generator().manual_seed(1)
    xs, w, b = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((2, 3, 8), (8,), (8,)))
    eps = 1e-5
    xt, wt, bt = Term.input("x"), Term.input("w"), Term.input("b")
    env = {"x": xs, "w": w, "b": b}
    (ln,) = evaluate([Term("layer_norm", (xt, wt, bt), (eps,))], env)
    mean, var = xs.mean(-1, keepdim=True), xs.var(-1, keepdim=True, unbiased=False)
    torch.testing.assert_close(ln, (xs - mean) / torch.sqrt(var + eps) * w + b)
    q, k, v = (torch.randn(2, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    (att,) = evaluate([Term("sdpa", (Term.input("q"), Term.input("k"), Term.input("v")), (0.3, True))],
                      {"q": q, "k": k, "v": v})
    scores = q @ k.transpose(-2, -1) * 0.3
    scores = scores.masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), -math.inf)
    torch.testing.assert_close(att, torch.softmax(scores, -1) @ v)


@pytest.mark.parametrize("op,fn,inputs", CASES, ids=[c[0] for c in CASES])
def test_shape_rules_agree_with_meta_evaluation(op, fn, inputs):
    """Shape inference takes rules for the common ops (100x faster): they must say what the ops'
    own meta kernels say."""
    from egraph_opt.lang.ops import parse_shape
    from egraph_opt.lang.term import SCALAR, shapes

    program, _ = capture(fn, inputs)
    roots = program.roots()
    inferred = shapes(roots)
    env = {t.attrs[0]: torch.empty(parse_shape(t.attrs[1]), dtype=getattr(torch, t.attrs[2]),
                                   device="meta") for t in postorder(roots) if t.op == "input"}
    values: dict = {}
    evaluate(roots, env, record=values)
    for t in postorder(roots):
        v = values[id(t)]
        assert inferred[id(t)] == ((tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else SCALAR), t.op


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
def test_compensated_sum_keeps_what_a_float32_sum_cancels(n):
    """1e8, small values, -1e8: a float32 sum drops the small values (1e8 has an ulp of 8); the
    compensated sum returns the float64 sum of the same float32 inputs, to float32 rounding."""
    x = torch.rand(3, n, generator=torch.Generator().manual_seed(n))
    if n >= 2:
        x[:, 0], x[:, -1] = 1e8, -1e8
    exact = x.double().sum(-1)
    got = OPS["compensated_sum"].impl(x, -1, False)
    assert got.dtype == torch.float32 and got.shape == (3,)
    torch.testing.assert_close(got.double(), exact, rtol=2 ** -23, atol=0)
    if n >= 64:  # where the plain sum is far off
        assert (x.sum(-1).double() - exact).abs().max() > 1.0


def test_cube_root_is_real_signed_and_correctly_rounded():
    """cbrt of a negative is negative (x ** (1/3) is NaN there), -0 and the infinities keep their
    signs, NaN stays NaN, and float32 results are the float64 root rounded once."""
    special = torch.tensor([-8.0, -0.0, 0.0, 27.0, math.inf, -math.inf, math.nan, 1e-45, -3e38])
    got = OPS["cbrt"].impl(special)
    want = torch.tensor([-2.0, -0.0, 0.0, 3.0, math.inf, -math.inf, math.nan, 1.119e-15, -6.69e12])
    torch.testing.assert_close(got, want, rtol=2e-3, atol=0, equal_nan=True)
    assert got[:3].signbit().tolist() == [True, True, False]
    x = (torch.randn(1000, dtype=torch.float64) * 1e3).float().double()
    torch.testing.assert_close(OPS["cbrt"].impl(x.float()), OPS["cbrt"].impl(x).float(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_keeps_the_top_of_the_range_and_the_sign(dtype, approximate):
    """gelu(x) = x at +inf and at the dtype's max (torch's erf kernel on AVX-512 CPUs gives NaN and
    +inf there), -0 and the underflowed tail stay negative zeros, on vectors the vectorized kernels
    take."""
    top = torch.finfo(dtype).max
    x = torch.tensor([math.inf, top, 1.0, -0.0, -200.0, math.nan] * 8, dtype=dtype)
    got = TORCH["gelu"](x, approximate)
    assert got[:2].tolist() == [math.inf, top]
    assert got[3:5].signbit().all() and (got[3:5] == 0).all() and got[5].isnan()
    torch.testing.assert_close(got[2].double(), F.gelu(torch.tensor(1.0, dtype=torch.float64), approximate=approximate),
                               rtol=1e-2, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_linear_at_overflow_is_the_same_in_every_summation_order(dtype, activation):
    """max + max - max - max - max is -max, whose activation is 0 (-0 for gelu); summed left to
    right in float32 it overflows to +inf first (relu and gelu then give +inf), in another order to
    -inf: the library's blocking, which differs by CPU, picks one. linear, linear_act and
    linear_add give the truth in every order (bfloat16 at its own max, which float32 accumulators hold)."""
    top = torch.finfo(dtype).max
    row = torch.tensor([top, top, -top, -top, -top], dtype=torch.float64)
    x = torch.stack([row[list(p)] for p in ((0, 1, 2, 3, 4), (2, 3, 4, 0, 1), (0, 2, 1, 3, 4))]).to(dtype)
    w = torch.ones(2, 5, dtype=dtype)
    assert (TORCH["linear"](x, w, None) == -top).all()
    got = TORCH["linear_act"](x, w, None, activation)
    assert (got == 0).all() and (got.signbit() == activation.startswith("gelu")).all(), got
    residual = torch.tensor([1.0, math.inf], dtype=dtype).expand(3, 2)  # linear_add: its epilogue too
    assert TORCH["linear_add"](x, w, None, residual).tolist() == [[-top, math.inf]] * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_linear_add_gives_the_definition_at_the_residuals_extremes_and_at_overflow(dtype):
    """linear(x, W, b) + r in one call: +-inf, NaN, +-0 and +-max in r give what the definition's
    add gives (close: the epilogue may round its add once, not twice); with autograd recording,
    and on the device path (no host read), the same values."""
    from egraph_opt.kernels.torch_ops import forcing_device_path
    g, top = torch.Generator().manual_seed(3), torch.finfo(dtype).max
    x, w, b = (torch.randn(s, generator=g, dtype=dtype) for s in ((3, 6, 5), (8, 5), (8,)))
    r = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, top, -top, 1.0], dtype=dtype).expand(3, 6, 8)
    want = TORCH["linear"](x, w, b) + r
    torch.testing.assert_close(TORCH["linear_add"](x, w, b, r), want, equal_nan=True)
    with forcing_device_path():
        torch.testing.assert_close(TORCH["linear_add"](x, w, b, r), want, equal_nan=True)
    recorded = TORCH["linear_add"](x.clone().requires_grad_(), w, b, r)
    torch.testing.assert_close(recorded.detach(), want, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_linear_scaled_is_its_definition_bit_for_bit_at_the_extremes(dtype):
    """One GEMM scaled by 2^k (alpha = beta): linear(x, W, b) * 2^k bit for bit on the host, at +-inf, NaN,
    +-0, +-max, at overflow and where results fall under the smallest normal; on the device path (no host
    read) the same where x is moderate."""
    from egraph_opt.kernels.torch_ops import forcing_device_path
    g, fi = torch.Generator().manual_seed(3), torch.finfo(dtype)
    x, w, b = (torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in ((3, 11, 5), (8, 5), (8,)))
    x[0, :7, 0] = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, fi.max, -fi.max], dtype=dtype)
    small = (x[1] * fi.tiny * 2 ** 18, w, b * fi.tiny * 2 ** 18)  # results under the smallest normal at 2^-20
    for scale in (0.5, 2.0 ** -20, 4.0, 2.0 ** 60, -2.0):
        for args in ((x, w, b), small):
            torch.testing.assert_close(TORCH["linear_scaled"](*args, scale), TORCH["linear"](*args) * scale,
                                       rtol=0, atol=0, equal_nan=True)
        want = TORCH["linear"](x, w, b) * scale
        with forcing_device_path():
            torch.testing.assert_close(TORCH["linear_scaled"](x[2], w, b, scale), want[2], equal_nan=True)


def _attention_definition(q, k, v, bias, scale):
    return torch.softmax((q @ k.transpose(-2, -1) * scale + bias).masked_fill(torch.isneginf(bias), -math.inf),
                         -1) @ v


def _filled_definition(q, k, v, keep, scale, fill):
    return torch.softmax(torch.where(keep, q @ k.transpose(-2, -1) * scale, fill), -1) @ v


@pytest.mark.parametrize("queries,keys", [(6, 6), (4, 6), (6, 4)])
def test_sdpa_filled_reads_its_keep_mask_once_per_version(queries, keys):
    """A causal keep-mask runs as is_causal; a row that keeps no key is the mean of v."""
    from egraph_opt.kernels.torch_ops import _MASK_FACTS, sdpa_filled
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64) for n in (queries, keys, keys))
    keep = torch.ones(queries, keys, dtype=torch.bool).tril()
    fill = torch.finfo(torch.float64).min
    for write in (None, (0, 1, True), (1, slice(None), False), (1, slice(None), True)):
        if write:
            keep[write[0], write[1]] = write[2]
        torch.testing.assert_close(sdpa_filled(q, k, v, keep, 0.3, fill),
                                   _filled_definition(q, k, v, keep, 0.3, fill), rtol=1e-12, atol=1e-12)
        assert _MASK_FACTS[id(keep)][2][0] is (write is None)


@pytest.mark.parametrize("queries,keys", [(6, 6), (4, 6), (6, 4)])
def test_a_mask_that_keeps_every_key_and_adds_zero_runs_as_no_mask(queries, keys):
    """An encoder's all-ones padding mask, as a zero bias (a -0.0 in it too) or a keep-mask of True: torch's kernel
    runs without one (the facts say none); a NaN or a masked key written into it is seen, and the definition's."""
    from egraph_opt.kernels.torch_ops import _MASK_FACTS, sdpa_filled, sdpa_masked
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64) for n in (queries, keys, keys))
    bias, keep = torch.zeros(2, 1, queries, keys, dtype=torch.float64), torch.ones(queries, keys, dtype=torch.bool)
    bias[0, 0, 0, 0] = -0.0
    for write, none in ((None, True), (math.nan, False), (-math.inf, False)):
        if write is not None:
            bias[1, 0, -1, 0], keep[-1, 0] = write, False
        torch.testing.assert_close(sdpa_masked(q, k, v, bias, 0.3), _attention_definition(q, k, v, bias, 0.3),
                                   rtol=1e-12, atol=1e-12, equal_nan=True)
        torch.testing.assert_close(sdpa_filled(q, k, v, keep, 0.3, -1e300),
                                   _filled_definition(q, k, v, keep, 0.3, -1e300), rtol=1e-12, atol=1e-12)
        assert _MASK_FACTS[id(bias)][2][2] is none and _MASK_FACTS[id(keep)][2][2] is none
    wider = torch.zeros(3, 1, queries, keys, dtype=torch.float64)  # more rows than q's batch: the definition's shape
    for run, mask in ((sdpa_masked, wider), (lambda *a: sdpa_filled(*a, -1e300), wider == 0)):
        with pytest.raises(RuntimeError, match="broadcast"):  # torch's kernel refuses it as before: no plan keeps it
            run(q[:1], k[:1], v[:1], mask, 0.3)


@pytest.mark.parametrize("queries,keys", [(6, 6), (4, 6), (6, 4)])
def test_sdpa_masked_reads_its_mask_once_per_version(queries, keys):
    """A causal bias runs as is_causal, a dead row is NaN; both are read once per version of the
    bias (a mask buffer is the same tensor every call), and an in-place write is seen."""
    from egraph_opt.kernels.torch_ops import _MASK_FACTS, sdpa_masked
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64) for n in (queries, keys, keys))
    bias = torch.zeros(queries, keys, dtype=torch.float64).masked_fill(
        torch.ones(queries, keys, dtype=torch.bool).triu(1), -math.inf)
    for write in (None, (0, 1, 0.0), (1, slice(None), -math.inf), (1, slice(None), 2.0)):  # 2.0: not 0
        if write:
            bias[write[0], write[1]] = write[2]
        torch.testing.assert_close(sdpa_masked(q, k, v, bias, 0.3), _attention_definition(q, k, v, bias, 0.3),
                                   rtol=1e-12, atol=1e-12, equal_nan=True)
        assert _MASK_FACTS[id(bias)][2][0] is (write is None)  # causal until the first write
    with torch.inference_mode():  # no version counter: read on every call, never cached
        frozen = bias.clone()
        torch.testing.assert_close(sdpa_masked(q, k, v, frozen, 0.3), _attention_definition(q, k, v, frozen, 0.3),
                                   rtol=1e-12, atol=1e-12)
        assert _MASK_FACTS.get(id(frozen), (lambda: None,))[0]() is not frozen  # ids are reused
    shifted = torch.zeros(queries, keys, dtype=torch.float64).masked_fill(  # causal, and adds 0.5
        torch.ones(queries, keys, dtype=torch.bool).triu(1), -math.inf)
    shifted[-1, 0] = 0.5
    torch.testing.assert_close(sdpa_masked(q, k, v, shifted, 0.3), _attention_definition(q, k, v, shifted, 0.3),
                               rtol=1e-12, atol=1e-12)
    assert _MASK_FACTS[id(shifted)][2][0] is False
    ones = torch.ones(queries, keys, dtype=torch.bool).tril()  # a boolean bias adds 1.0: no mask
    torch.testing.assert_close(sdpa_masked(q, k, v, ones, 0.3), _attention_definition(q, k, v, ones.double(), 0.3),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scale", [1.0, 1e19, 1e30, 3e37])
def test_layer_norm_rows_whose_float32_variance_overflows_are_normalized(scale):
    """float32 layer norm gives NaN or the bias on rows beyond ~sqrt(max / n); the kernel finds
    them by their 1/std and recomputes them in float64: every finite row matches float64, a row
    holding inf or NaN is NaN, and a half-precision row (accumulated in float32) is as torch's."""
    from egraph_opt.kernels import torch_ops as ops
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(4, 64, generator=g), torch.randn(64, generator=g), torch.randn(64, generator=g)
    x[0] *= scale
    x[2] *= scale / 2
    x[3, 5] = math.inf
    got = ops.layer_norm(x, w, b, 1e-5)
    ref = F.layer_norm(x.double(), (64,), w.double(), b.double(), 1e-5)
    torch.testing.assert_close(got[:3].double(), ref[:3], rtol=1e-5, atol=1e-5)
    assert got[3].isnan().all()
    half = torch.randn(3, 64, generator=g).half() * 1e3
    w, b = w.half(), b.half()
    torch.testing.assert_close(ops.layer_norm(half, w, b, 1e-5), F.layer_norm(half, (64,), w, b))
