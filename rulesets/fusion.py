"""Fusion rewrites: chains of primitive ops into the fused ops kernels implement.

Canonical forms (algebra: constants on the right, division by a constant as a product) let one rule catch every
spelling: scale by multiply or divide, K transposed either way, max shift explicit or not, masks filled or added."""
import functools
import math

from . import Exactness, Family, Rule, rules, when
from .algebra import POWER_OF_TWO, in_float32

_F, _SCORES = Family.FUSION, "(matmul ?q (transpose ?k -2 -1))"
_SCALED = f"(mul {_SCORES} (const ?c))"
_MASK_BIAS = "(where ?m (const -inf) (const 0.0))"  # masked_fill(m, -inf) as the bias that masks
#: the dynamo exporter's softmax guard (torch's _safe_softmax in ONNX): each NaN weight is 0
_GUARD = "(where (isnan (softmax {s} -1)) (const 0.0) (softmax {s} -1))"
_NORMALIZED = {  # (x - mean) / sqrt(var + eps), as divided and as multiplied by rsqrt
    "div": "(div (sub ?x (mean ?x -1 true)) (sqrt (add (var ?x -1 true 0) (const ?eps))))",
    "rsqrt": "(mul (sub ?x (mean ?x -1 true)) (rsqrt (add (var ?x -1 true 0) (const ?eps))))"}
_AFFINE = when("(= (rank ?w) 1)", "(= (rank ?b) 1)", "(= (last-dim ?w) (last-dim ?x))",
               "(= (last-dim ?b) (last-dim ?x))")
_LN_SAMPLE = (("w", (5,)), ("b", (5,)))
_FOLDED = "(mul (rsqrt (add (var ?x -1 true 0) (const ?eps))) ?w)"  # the weight in the scale
#: x * rsqrt(mean(x^2) + eps) with the square of ``sq`` (x itself, or x widened to float32)
_RMS = "(mul ?x (rsqrt (add (mean (mul {sq} {sq}) -1 true) (const ?eps))))"
_RMS_PLAIN = "(rms_norm ?x (const 1.0) ?eps)"
_WEIGHT = when("(= (rank ?w) 1)", "(= (last-dim ?w) (last-dim ?x))")
_LINEAR_SAMPLE = (("w", (5, 5)), ("b", (5,)))
_GS = "(div (param ?gn ?gs ?gd) (sqrt (add (param ?vn ?vs ?vd) (const ?eps))))"  # BN scale
_CONV = "?x (param ?wn ?ws ?wd) ?cb ?s ?p ?d ?g"
_BN_PARAMS = "(param ?mn ?ms ?md) (param ?vn ?vs ?vd) (param ?gn ?gs ?gd) (param ?bn ?bs ?bd)"


def _softmax_float32(dtype: str, masked: bool) -> Rule:
    """A half-precision attention whose softmax runs in float32 (``softmax(s.float()).to(q.dtype)``, ``type_as``,
    ``softmax(dtype=float32)``; transformers' eager attention adds its mask first): sdpa on float32 copies, rounded
    once: the left side errs in its rounded scores (which overflow where sdpa's do not) and weights, the right less."""
    wide = " ".join(f'(cast ?{v} "float32")' for v in "qkv")
    scores, fused = (f"(add {_SCALED} ?m)", f'(sdpa_masked {wide} (cast ?m "float32") ?c)') if masked \
        else (_SCALED, f"(sdpa {wide} ?c false)")
    return Rule(f"attention-fuse-{'masked-' if masked else ''}softmax-float32-{dtype}",
                f'(matmul (cast (softmax (cast {scores} "float32") -1) "{dtype}") ?v)',
                f'(cast {fused} "{dtype}")', _F,
                when=tuple(f'(= (dtype-of ?{v}) "{dtype}")' for v in "qv"),
                why="float32 softmax inside a half-precision attention")


#: where gelu's 1/2 multiplies: x, the bracket (ONNX Runtime's TF/Keras graphs) or the product
_HALF = {"": "(mul (mul ?x (const 0.5)) {})", "-half-inside": "(mul ?x (mul {} (const 0.5)))",
         "-half-last": "(mul (mul ?x {}) (const 0.5))"}


def _gelu(name: str, inner: str, why: str, erf_c: float = 0.0) -> list[Rule]:
    """x/2 (1 + tanh(``inner``)), ``inner`` a spelling of sqrt(2/pi) (x + 0.044715 x^3); or, given
    ``erf_c`` (1/sqrt(2) multiplied or sqrt(2) divided), x/2 (1 + erf(``inner``)); each place of 1/2."""
    sample = (("c", erf_c),) if erf_c else (("c", math.sqrt(2 / math.pi)), ("k", 0.044715))
    return [Rule(name + at, half.format(f"(add ({'erf' if erf_c else 'tanh'} {inner}) (const 1.0))"),
                 f'(gelu ?x "{"none" if erf_c else "tanh"}")', _F, Exactness.APPROX, sample=sample, why=why,
                 when=when(*(f"(< (abs (- ?{k} {v!r})) 1e-7)" for k, v in sample)))  # as float32 stores them
            for at, half in _HALF.items()]


_KX2 = "(mul (mul ?x (const ?k)) ?x)"  # 0.044715 * x * x as traced

#: each attention as (name, lhs over scores {s}, rhs over scale {c}, why): a rule scaled and one unscaled (scale 1.0)
_ATTENTIONS = [
    ("attention-fuse", "(matmul (softmax {s} -1) ?v)", "(sdpa ?q ?k ?v {c} false)", ""),
    ("attention-fuse-masked", "(matmul (softmax (add {s} ?m) -1) ?v)", "(sdpa_masked ?q ?k ?v ?m {c})", ""),
    ("attention-fuse-mask-filled", "(matmul (softmax (where ?m (const -inf) {s}) -1) ?v)",
     f"(sdpa_masked ?q ?k ?v {_MASK_BIAS} {{c}})", "masked_fill(mask, -inf)"),
    ("attention-fuse-where-filled", "(matmul (softmax (where ?m {s} (const ?f)) -1) ?v)",
     "(sdpa_filled ?q ?k ?v ?m {c} ?f)", "GPT-2: where(causal, w, finfo.min)"),
    ("attention-fuse-fill-masked", "(matmul (softmax (where ?m (const ?f) {s}) -1) ?v)",
     "(sdpa_filled ?q ?k ?v (logical_not ?m) {c} ?f)",
     "masked_fill(mask == 0, -1e9) (the Annotated Transformer), (mask, finfo.min)"),
    ("attention-fuse-where-filled-biased", "(matmul (softmax (where ?m (add {s} ?b) (const ?f)) -1) ?v)",
     "(sdpa_filled_biased ?q ?k ?v ?m ?b {c} ?f)", "where(causal, w + alibi, finfo.min)"),
    ("attention-fuse-fill-masked-biased", "(matmul (softmax (where ?m (const ?f) (add {s} ?b)) -1) ?v)",
     "(sdpa_filled_biased ?q ?k ?v (logical_not ?m) ?b {c} ?f)", "MPT: masked_fill(mask, finfo.min) after alibi"),
    ("attention-fuse-where-filled-then-biased", "(matmul (softmax (add (where ?m {s} (const ?f)) ?b) -1) ?v)",
     "(sdpa_filled_then_biased ?q ?k ?v ?m ?b {c} ?f)", "GPT-NeoX: where(causal, w, finfo.min) + mask"),
    ("attention-fuse-floored", "(matmul (softmax (maximum (add {s} ?m) (const ?f)) -1) ?v)",
     "(sdpa_floored ?q ?k ?v ?m {c} ?f)", "OPT: torch.max(w + mask, finfo.min)"),
    ("attention-fuse-guarded", f"(matmul {_GUARD.format(s='(add {s} ?m)')} ?v)", "(sdpa_guarded ?q ?k ?v ?m {c})",
     "GPT-2, BERT as the dynamo exporter writes them; unscaled, the scale on q and k (sqrt of it on each)")]

RULES = rules(_F, [(name + suffix, lhs.format(s=s), rhs.format(c=c), why) for name, lhs, rhs, why in _ATTENTIONS
                   for suffix, s, c in (("", _SCALED, "?c"), ("-unscaled", _SCORES, "1.0"))] + [
    ("permute-as-transposed-heads", '(permute ?k "0,2,3,1")',                       '(transpose (permute ?k "0,2,1,3") -2 -1)',
                                  "K split into heads and transposed by one permute"),
    ("attention-fuse-masked-biased", f"(matmul (softmax (add (add {_SCALED} ?a) ?m) -1) ?v)",
                                  "(sdpa_masked ?q ?k ?v (add ?a ?m) ?c)", Exactness.REASSOC,
                                  "BLOOM: a position bias (alibi, baddbmm) added, then the mask: one bias, their sum"),
    ("attention-fuse-scaled-biased", f"(matmul (softmax (add (mul (add {_SCORES} ?a) (const ?c)) ?m) -1) ?v)",
                                  "(sdpa_masked ?q ?k ?v (add (mul ?a (const ?c)) ?m) ?c)", Exactness.REASSOC,
                                  "Falcon: (q k^T + alibi) * scale + mask, the scale distributed over the sum"),
    ("attention-fuse-where-filled-then-biased-baddbmm", f"(matmul (softmax (add (where ?m (add {_SCALED} (const 0.0)) "
                                  "(const ?f)) ?b) -1) ?v)", "(sdpa_filled_then_biased ?q ?k ?v ?m ?b ?c ?f)",
                                  "baddbmm into zeros: + 0 turns a -0 score +0, which the softmax cannot tell"),
    ("attention-fuse-fill-masked-rescaled", f"(matmul (softmax (where ?m (const ?f) (mul (add ?b {_SCALED}) "
                                  "(const ?l))) -1) ?v)", "(sdpa_filled_biased ?q ?k ?v (logical_not ?m) (mul ?b "
                                  "(const ?l)) (* ?c ?l) ?f)", Exactness.REASSOC, when(*in_float32("(* ?c ?l)")),
                                  "BLOOM: baddbmm(alibi, q, k^T, beta, alpha) * layer_number, masked_fill(finfo.min)"),
    ("silu-fuse",                 "(mul ?x (sigmoid ?x))",                             "(silu ?x)"),
    ("silu-fuse-sigmoid-first",   "(mul (sigmoid ?x) ?x)",                             "(silu ?x)",
                                  "SwiGLU's gate as written: sigmoid(a) * a"),
]) + rules(_F, [
    ("linear-relu-fuse",          "(relu (linear ?x ?w ?b))",                          '(linear_act ?x ?w ?b "relu")'),
    ("linear-gelu-fuse",          '(gelu (linear ?x ?w ?b) "none")',                   '(linear_act ?x ?w ?b "gelu")'),
    ("linear-gelu-tanh-fuse",     '(gelu (linear ?x ?w ?b) "tanh")',                   '(linear_act ?x ?w ?b "gelu_tanh")'),
    ("linear-residual-fuse",      "(add (linear ?x ?w ?b) ?r)",                        "(linear_add ?x ?w ?b ?r)"),
    ("linear-residual-fuse-first", "(add ?r (linear ?x ?w ?b))",                       "(linear_add ?x ?w ?b ?r)"),
    ("linear-scale-fuse",         "(mul (linear ?x ?w ?b) (const ?c))",                "(linear_scaled ?x ?w ?b ?c)",
                                  when(POWER_OF_TWO, *in_float32("?c")), {"sample": (*_LINEAR_SAMPLE, ("c", 0.5))},
                                  "x W^T + b times 2^k: a GEMM's alpha and beta (x / 2^k too, "
                                  "as x * 2^-k); another scale would round otherwise than the program"),
], sample=_LINEAR_SAMPLE) + rules(_F, [
    ("linear-fuse",               "(add (matmul ?x (transpose ?w -2 -1)) ?b)",         "(linear ?x ?w ?b)",
                                  when("(= (rank ?w) 2)", "(= (rank ?b) 1)"), {"sample": _LINEAR_SAMPLE}),
    ("linear-fuse-in-out",        "(add (matmul ?x ?w) ?b)",                           "(linear ?x (transpose ?w -2 -1) ?b)",
                                  when("(= (rank ?w) 2)", "(= (rank ?b) 1)"), {"sample": _LINEAR_SAMPLE},
                                  "x @ W + b with W stored (in, out), as minGPT-style code and JAX ports write it"),
    *_gelu("gelu-from-erf", "(mul ?x (const ?c))", "x * Phi(x); 1/sqrt(2) as float32 stores it", 1 / math.sqrt(2)),
    *_gelu("gelu-from-tanh", "(mul (add ?x (mul (pow ?x (const 3.0)) (const ?k))) (const ?c))",
           "GPT-2's gelu; sqrt(2/pi) and 0.044715 as float32 stores them"),
    *_gelu("gelu-from-erf-divided", "(div ?x (const ?c))", "x * Phi(x) as BERT: erf(x / sqrt(2))", math.sqrt(2)),
    *_gelu("gelu-from-tanh-products", f"(mul (add ?x (mul {_KX2} ?x)) (const ?c))", "the cube as k * x * x * x"),
    *_gelu("gelu-from-tanh-factored", f"(mul (mul ?x (const ?c)) (add {_KX2} (const 1.0)))",
           "FastGELU, Megatron's bias_gelu: tanh(c x (1 + k x^2))"),
    ("conv-batch-norm-fold",      f"(batch_norm (conv2d {_CONV}) {_BN_PARAMS} ?eps)",
                                  f'(conv2d ?x (mul (param ?wn ?ws ?wd) (reshape {_GS} (+ ?ms ",1,1,1"))) '
                                  f"(add (mul (sub ?cb (param ?mn ?ms ?md)) {_GS}) (param ?bn ?bs ?bd)) ?s ?p ?d ?g)",
                                  Exactness.REASSOC, {"sample": (
                                      ("x", (2, 3, 6, 6)), ("cb", (4,)), ("ws", "4,3,3,3"), ("ms", "4"), ("vs", "4"),
                                      ("gs", "4"), ("bs", "4"), ("s", "1,1"), ("p", "1,1"), ("d", "1,1"), ("g", 1),
                                      ("eps", 1e-5))},
                                  "eval-mode batch norm of a conv with constant parameters is one conv"),
]) + rules(_F, [
    (f"layer-norm-fuse-{form}{'-weight-first' if first else ''}",
     f"(add (mul {'?w ' + n if first else n + ' ?w'}) ?b)", "(layer_norm ?x ?w ?b ?eps)")
    for form, n in _NORMALIZED.items() for first in (False, True)
] + [("layer-norm-fuse-folded", f"(add (mul ?x {_FOLDED}) (sub ?b (mul (mean ?x -1 true) {_FOLDED})))",
      "(layer_norm ?x ?w ?b ?eps)", Exactness.REASSOC, "ONNX Runtime's TF layer norm: x s + (b - mean s), s = w / std")
     ], when=_AFFINE, sample=_LN_SAMPLE) + rules(_F, [
    *((f"layer-norm-fuse-plain-{form}", n, "(layer_norm ?x (const 1.0) (const 0.0) ?eps)")
      for form, n in _NORMALIZED.items()),
    # RMSNorm (LLaMA, T5, Gemma): the plain form, then its weight taken in from either side
    ("rms-norm-fuse",             _RMS.format(sq="?x"),                                _RMS_PLAIN,
                                  "x / rms(x), rms over the last axis"),
    *((f"rms-norm-fuse-widened-{d}", _RMS.format(sq='(cast ?x "float32")'),
       '(rms_norm (cast ?x "float32") (const 1.0) ?eps)', when(f'(= (dtype-of ?x) "{d}")'),
       "T5: the mean of squares in float32, x itself half (x * r widens it exactly)")
      for d in ("float16", "bfloat16")),
    *((f"rms-norm-weight{at}", lhs, "(rms_norm ?x ?w ?eps)", _WEIGHT, {"sample": (("w", (5,)),)}, why)
      for at, lhs, why in (("", f"(mul {_RMS_PLAIN} ?w)", ""),
                           ("-first", f"(mul ?w {_RMS_PLAIN})", "LLaMA: weight * normalized")))])


def _horizontal(count: int, biased: bool = True) -> Rule:
    """``count`` linears (``biased``) or matmuls by transposed weights (LLaMA's bias-free projections) of one input with
    constant weights: one of the concatenated weights, sliced (QKV, gate and up); each order is an alternative."""
    ws = [f"(param ?w{i} ?ws{i} ?wd{i})" for i in range(1, count + 1)]
    bs = [f"(param ?b{i} ?bs{i} ?bd{i})" for i in range(1, count + 1)]
    weights, biases = ws[0], bs[0]
    for w, b in zip(ws[1:], bs[1:]):
        weights, biases = f"(concat {weights} {w} -2)", f"(concat {biases} {b} -1)"
    of = (lambda w, b: f"(linear ?x {w} {b})") if biased else (lambda w, b: f"(matmul ?x (transpose {w} -2 -1))")
    starts, end = ["0"], "?n1"
    for i in range(2, count + 1):
        starts.append(end)
        end = f"(+ {end} ?n{i})"
    roots = [(of(w, b), f"(slice {of(weights, biases)} -1 {start} {stop} 1)")
             for w, b, start, stop in zip(ws, bs, starts, starts[1:] + [end])]
    names = ["__lhs"] + [f"__lhs{i}" for i in range(2, count + 1)]
    distinct = tuple(f"(!= ?w{i} ?w{j})" for i in range(1, count + 1) for j in range(i + 1, count + 1))
    sizes = tuple(f"(= ?n{i} (last-dim {n}))" for i, n in enumerate(names, 1))
    sample = (("x", (2, 3, 4)), *((f"ws{i}", f"{i + 2},4") for i in range(1, count + 1)),
              *((f"bs{i}", f"{i + 2}") for i in range(1, count + 1) if biased),
              *((f"n{i}", i + 2) for i in range(1, count + 1)))
    return Rule(f"{'linear' if biased else 'matmul'}-horizontal-fuse-{count}", roots[0][0], roots[0][1], _F,
                when=distinct + sizes, more=tuple(roots[1:]), sample=sample,
                binds=tuple(f"n{i}" for i in range(1, count + 1)),
                why=f"{count} projections of one input: one matmul, then slices")


RULES += [_horizontal(n, biased) for n in (2, 3) for biased in (True, False)]
# unscaled, the extremes test finds float16 k = 65504 (scores ~2e5, every key tied) where torch's
# kernel rounds each score on its own and misses the tie by 2%: not declared
# masked in float16 not declared: at float16's max (scores of ~1e5) the float32 kernel's weights
# err by ~0.5% where the left side is NaN, beyond what the extremes test grants a NaN's repair
RULES += [_softmax_float32(d, masked) for d in ("float16", "bfloat16") for masked in (False, True)
          if not (masked and d == "float16")]


def _rotary(x_first: bool, rotated_first: bool) -> Rule:
    """x cos + rotate_half(x) sin (transformers' Llama and GPT-NeoX), either factor first in each
    product; rotate_half(x) = cat(-x2, x1) over the two halves of an even last axis."""
    rotated = "(concat (neg (slice ?x -1 ?h ?d 1)) (slice ?x -1 0 ?h 1) -1)"
    cos = "(mul ?x ?c)" if x_first else "(mul ?c ?x)"
    sin = f"(mul {rotated} ?s)" if rotated_first else f"(mul ?s {rotated})"
    order = "-".join(("x-cos" if x_first else "cos-x", "rotated-sin" if rotated_first else "sin-rotated"))
    return Rule(f"rotary-fuse-{order}", f"(add {cos} {sin})", "(rotary ?x ?c ?s)", _F,
                when=("(= ?d (last-dim ?x))", "(= ?d (* 2 ?h))"),
                sample=(("x", (2, 3, 4, 6)), ("c", (4, 6)), ("s", (4, 6)), ("h", 3), ("d", 6)))


#: -log(softmax(x)).gather(-1, t[:, None]) of (N, C) logits and N class indices t: per sample, the cross-entropy of the
#: first len(t) rows (gather reads no further), never an ignored target (a negative index fails); then reduced, or not
_GATHERED = "(gather (log_softmax ?x -1) (reshape ?t ?s) -1)"
_LOSS = '(cross_entropy (slice ?x -2 0 ?n 1) ?t "{}" -100)'
_PICKED_FORMS = {  # reduction -> (its spelling, the right side around the loss)
    "none": (f"(neg {_GATHERED})", "(reshape {} ?s)"),
    "mean": (f"(neg (mean (mean {_GATHERED} -1 false) -1 false))", "{}"),
    "sum": (f"(neg (sum (sum {_GATHERED} -1 false) -1 false))", "{}")}
_T_COLUMN = when("(= (rank ?t) 1)", "(= ?n (last-dim ?t))", '(= ?s (+ (to-string ?n) ",1"))')

RULES += rules(_F, [
    ("swish-fuse",                "(mul ?x (sigmoid (mul ?x (const ?b))))",            "(swish ?x ?b)",
                                  "x sigmoid(b x): CLIP's quick gelu (b = 1.702), which is no gelu"),
    *((f"geglu-fuse{suffix}", lhs, "(geglu ?a ?b ?p)", {"sample": (("p", "tanh"),)}, "GeGLU: gelu(a) * b")
      for suffix, lhs in (("", "(mul (gelu ?a ?p) ?b)"), ("-gate-last", "(mul ?b (gelu ?a ?p))"))),
    *(_rotary(x_first, rotated_first) for x_first in (True, False) for rotated_first in (True, False)),
    ("cross-entropy-fuse",        "(nll_loss (log_softmax ?x -1) ?t ?r ?i)",           "(cross_entropy ?x ?t ?r ?i)",
                                  when("(= (rank ?t) 1)"), {"sample": (("x", (5, 6)), ("t", (5,)), ("r", "mean"), ("i", 2))},
                                  "nll_loss of log_softmax over the classes of (N, C) logits"),
    *((f"cross-entropy-from-gather-{reduction}", lhs, rhs.format(_LOSS.format(reduction)), _T_COLUMN,
       {"binds": ("n",), "sample": (("x", (5, 6)), ("t", (4,)), ("n", 4), ("s", "4,1"))},
       "the picked log-probabilities of t[:, None]: cross-entropy, no target ignored")
      for reduction, (lhs, rhs) in _PICKED_FORMS.items())])


def _repeat_kv_into(op: str, rest: str) -> Rule:
    """Attention over k and v whose heads transformers' repeat_kv (or repeat_interleave) repeated to q's: x (B, Hkv, T,
    D) viewed as (B, Hkv, 1, T, D), expanded, merged to (B, Hkv G, T, D). It takes x itself: no copy of a KV cache."""
    guard, one = [], '"1"'
    joined = lambda *sizes: functools.reduce(lambda a, b: f'(+ (+ {a} ",") {b})', sizes)  # noqa: E731 - "B,H,T,D"
    for x in "kv":  # each shape attribute spelled from x's sizes, and G from q's heads
        b, h, t, d = (f"(to-string (axis-size ?{x} {axis}))" for axis in range(-4, 0))
        guard += [f"(= (rank ?{x}) 4)", f"(= ?{x}g (/ (axis-size ?q -3) (axis-size ?{x} -3)))",
                  f"(= (axis-size ?q -3) (* ?{x}g (axis-size ?{x} -3)))", f"(= ?{x}1 {joined(b, h, one, t, d)})",
                  f"(= ?{x}2 {joined(b, h, f'(to-string ?{x}g)', t, d)})",
                  f"(= ?{x}3 {joined(b, '(to-string (axis-size ?q -3))', t, d)})"]
    k, v = (f"(reshape (expand (reshape ?{x} ?{x}1) ?{x}2) ?{x}3)" for x in "kv")
    sample = [(x + n, s) for x in "kv" for n, s in (("", (2, 2, 5, 5)), ("1", "2,2,1,5,5"), ("2", "2,2,2,5,5"),
                                                    ("3", "2,4,5,5"), ("g", 2))]
    return Rule(f"repeat-kv-into-{op.replace('_', '-')}", f"({op} ?q {k} {v} {rest})", f"({op} ?q ?k ?v {rest})", _F,
                when=tuple(guard), binds=("kg", "vg"), sample=(("q", (2, 4, 5, 5)), ("m", (5, 5)), *sample))


RULES += [_repeat_kv_into(op, rest) for op, rest in (("sdpa", "?s ?c"), ("sdpa_masked", "?m ?s"),
                                                     ("sdpa_filled", "?m ?s ?f"), ("sdpa_guarded", "?m ?s"))]
