"""Every rule at the edges of floating point, generated from the catalogue, never per rule.

Both sides are evaluated in float32 (elementwise rules in float16 too) at +-inf, +-0, NaN, the
dtype's max, tiny and smallest subnormal, and where exp overflows and underflows, at points that
satisfy the rule's guard. Against the float64 truth of the left side (an infinite input approached
as a limit: two orders of huge finite values, NaN where they disagree):

- where the left side is finite, the right side is finite and close to it (or closer to the truth);
- where it is not finite, the right side equals it or lies toward the truth;
- zeros and infinities keep their signs.
"""
import dataclasses
import itertools
import math

import mpmath
import pytest
import torch

from egraph_opt.kernels.torch_ops import TORCH
from egraph_opt.lang import pattern as pat
from egraph_opt.rulesets import Exactness
from egraph_opt.lang import term
from egraph_opt.extractors.rounding_error import ELEMENTWISE
from egraph_opt.lang.ops import OPS
from egraph_opt.lang.term import Term, postorder
from egraph_opt.rulesets.algebra import POWER_OF_TWO

from exact_reals import MP, MP_DIGITS, mp_value
from test_rule_soundness import (RULES, SCALAR_RULES, _SIGNS, _index_vars, _sexp, _uses, _value, all_sides,
                                 bind, on_devices)


def evaluate(roots, env, **options):
    """Values of the roots; one spread over a mesh (a sharding rule's) as every device's parts."""
    return on_devices(*term.evaluate(roots, env, **{"kernels": TORCH, **options}))

INF, NAN = math.inf, math.nan
#: relative tolerance by exactness class and dtype: rounding of extreme operands, not error
TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2}
APPROX_FACTOR = 10
#: attribute values a scalar rule's constants take (folds that overflow, underflow, divide by 0)
ATTRIBUTES = (0.0, 2.0, -0.5, 1e30, -1e-30, 1e-39, 3e38)
SIGN_FACTS = {"positive": lambda v: v > 0, "nonneg": lambda v: v >= 0, "negative": lambda v: v < 0,
              "nonzero": lambda v: v != 0 and v == v}  # NaN satisfies none: no declared range holds it


def extremes(dtype: torch.dtype) -> list[float]:
    """The edge values of ``dtype``, each with both signs, and NaN."""
    fi = torch.finfo(dtype)
    subnormal = fi.tiny * fi.eps
    overflow = math.log(fi.max)  # exp overflows just above
    magnitudes = [0.0, subnormal, fi.tiny, 0.5, 1.0, 3.0, overflow - 0.5, overflow + 0.5,
                  1 - math.log(subnormal), fi.max, INF]  # exp(-that) underflows to 0
    return [m * s for m in magnitudes for s in (1.0, -1.0)] + [NAN]


def _facts(rule):
    """(sign facts by variable, dtype by variable, other facts) of the rule's guard."""
    signs, dtypes, rest = {}, {}, []
    for fact in map(str, rule.when):
        e = _sexp(fact)
        if e[0] in _SIGNS:
            signs[e[1][1:]] = e[0]
        elif e[0] == "=" and isinstance(e[1], list) and e[1][0] == "dtype-of":
            dtypes[e[1][1][1:]] = getattr(torch, e[2].strip('"'))
        elif "__lhs" not in fact:
            rest.append(e)
    return signs, dtypes, rest


def holds(e, values: dict, env: dict):
    """A guard fact at every element: ``lo``/``hi`` of a variable are its value there (each point
    is a program whose ranges are that point); attributes are Python numbers."""
    return _value(e, values, env, bound=lambda x, head: x.double())


def _two_orders(lhs: Term, env: dict, nudge_zeros: bool = False) -> list[torch.Tensor]:
    """The left side in float64 with each infinite input replaced by a huge finite one of its sign
    (and, with ``nudge_zeros``, each zero moved toward its sign by 1e-9, 1e-12, ...), the
    magnitudes assigned across variables in two orders."""
    names = sorted(k for k, v in env.items() if v.is_floating_point())
    same = not any(bool((env[k].isinf() | (env[k] == 0 if nudge_zeros else False)).any()) for k in names)
    outs = []
    for order in (names, names[::-1])[:1 if same else 2]:  # nothing to move: one order is both
        probe = dict(env)
        for i, name in enumerate(order):
            x = env[name].double()
            if nudge_zeros:
                delta = 10.0 ** (-9 - 3 * i)
                x = torch.where(x == 0, torch.where(x.signbit(), -delta, delta), x)
            probe[name] = torch.where(x.isinf(), x.sign() * 10.0 ** (300 - 20 * i), x)
        (out,) = evaluate([lhs], probe, reference=True)
        outs.append(torch.as_tensor(out, dtype=torch.float64))
    return outs * (2 if same else 1)


def truth(lhs: Term, env: dict) -> torch.Tensor:
    """The left side in float64, each infinite input replaced by a huge finite one of its sign, in
    two orders of magnitude across variables; NaN where the two orders disagree (no limit), unless
    both overflow the inputs' dtype to the same infinity (inf / 3e38^2: 1e223 or 1e183, inf either way)."""
    a, b = _two_orders(lhs, env)
    dtype = next((v.dtype for v in env.values() if v.is_floating_point()), torch.float64)
    top = torch.finfo(dtype).max
    overflow = (a.abs() > top) & (b.abs() > top) & (a.sign() == b.sign())
    agree = (a == b) | (a.isnan() & b.isnan()) | overflow
    return torch.where(agree, a, torch.full_like(a, NAN))


def exact_truth(lhs: Term, env: dict, true: torch.Tensor, where: torch.Tensor) -> torch.Tensor | None:
    """``true`` with the elements at ``where`` computed exactly (80 digits, no overflow) when the
    left side is elementwise: float64 overflows inside exp(a) * exp(b) at a = float32 max and
    cancels in sqrt(x + 1) - sqrt(x) there, where the real value is finite (an infinite input is
    a limit, in two orders, as in truth(); an input of 0 is the real 0). None for other ops."""
    if any(t.op not in MP and t.op not in ("const", "input") for t in postorder([lhs])):
        return None
    names = sorted(k for k, v in env.items() if v.is_floating_point())
    shape = where.shape
    flat = {k: torch.broadcast_to(env[k].double(), shape).flatten().tolist() for k in names}
    out = torch.broadcast_to(true, shape).flatten().clone()
    with mpmath.workdps(MP_DIGITS):
        for i in where.flatten().nonzero().flatten().tolist():
            results = []
            for order in (names, names[::-1]):
                point = {}
                for j, name in enumerate(order):
                    x = flat[name][i]
                    point[name] = (mpmath.mpf(10) ** (300 - 20 * j) * (1 if x > 0 else -1)
                                   if math.isinf(x) else mpmath.mpf(x))
                results.append(mp_value(lhs, point))
            if None in results:
                continue
            if all(r == 0 for r in results):
                continue  # a real 0 has no sign: float64's zero keeps the left side's
            a, b = (float(r) for r in results)
            out[i] = a if a == b or (math.isnan(a) and math.isnan(b)) else NAN
    return out.reshape(shape)


def limit_sign(lhs: Term, env: dict) -> torch.Tensor:
    """The sign of the left side's real function just off its zero inputs, each moved toward its own
    sign: -1 or +1, or 0 where it has none. float64 loses such signs (log(1 + x) at x = -0 is
    log(1) = +0, where log(1 + x) < 0 for every x < 0: log1p's -0 is the right zero), so a right
    side may keep the real sign instead of the left side's. Zeros of several variables move by
    1e-9, 1e-12, ... in two orders; where the orders disagree (a*a - b*b at a = -0, b = +0) the
    function has no sign there and the left side's zero must be kept. Infinities as in truth()."""
    a, b = (out.sign().nan_to_num(0.0) for out in _two_orders(lhs, env, nudge_zeros=True))
    return torch.where(a == b, a, torch.zeros_like(a))


#: ops that sum products in an order torch leaves to the library (BLAS and oneDNN blocking,
#: threads, FMA): where the terms' magnitudes add up past the dtype's max, some order overflows
SUMMING = frozenset({"matmul", "linear", "conv2d"})
#: ops whose value on magnitudes bounds every partial sum (sub and neg as add and identity below;
#: the mesh ops move values or sum them)
MAJORANT = SUMMING | {"add", "mul", "transpose", "reshape", "slice", "concat", "cast", "batch_norm",
                      "shard", "all_gather", "all_reduce", "reduce_scatter"}


def _majorant(t: Term) -> Term:
    """A term bounding, on the inputs' magnitudes, every partial sum of ``t``: each term counted
    with its magnitude (a - b as |a| + |b|; batch norm's mean added, not subtracted)."""
    if t.op == "const":
        return Term.const(abs(t.attrs[0]))
    args = tuple(_majorant(a) for a in t.args)
    if t.op == "neg":
        return args[0]
    if t.op == "batch_norm":
        args = (args[0], Term("neg", (args[1],)), *args[2:])
    elif t.op not in MAJORANT | {"sub"} and t.args:
        raise KeyError(t.op)
    return Term("add" if t.op == "sub" else t.op, args, t.attrs)


def magnitudes(lhs: Term, env: dict) -> torch.Tensor | None:
    """The majorant of a left side that sums products (matmul, linear, conv2d) on the inputs'
    magnitudes, in float64; None for any other left side."""
    ops = {t.op for t in postorder([lhs])}
    if not ops & SUMMING or not ops <= MAJORANT | {"sub", "neg", "const", "input", "param"}:
        return None
    size = {k: v.abs() if v.is_floating_point() else v for k, v in env.items()}
    (out,) = evaluate([_majorant(lhs)], size, reference=True)
    return torch.as_tensor(out)


def order_free(size: torch.Tensor | None, dtype) -> torch.Tensor:
    """Where the left side sums products (matmul, linear, conv2d) whose magnitudes add up past
    ``dtype``'s max: whether a float evaluation overflows there, and to +inf, -inf or NaN (inf -
    inf), depends on the summation order, which torch leaves to the library (the same matmul
    overflows or not with another blocking or thread count), so the left side's value there is one
    order's accident and a right side may overflow instead (moving a scale out of or into a sum, or
    summing a fused matrix, changes the order). Elsewhere the contract holds as stated. ``size``:
    ``magnitudes`` of the left side."""
    return torch.zeros((), dtype=torch.bool) if size is None else size >= torch.finfo(dtype).max


#: torch's vectorized float32 sinh and cosh compute e^|x| before halving it (AVX2, 16 or more
#: elements: sinh(89.22) is inf there and 2.8e38 on the scalar path), so where the result passes
#: half the max a right side computing either may overflow: the kernel's accident, not the rule's
HALVED_EXP = {"sinh", "cosh"}


def kernel_overflow(right: Term, true: torch.Tensor, dtype) -> torch.Tensor:
    """Where ``right`` runs a HALVED_EXP kernel and the truth passes half of ``dtype``'s max."""
    if not any(t.op in HALVED_EXP for t in postorder([right])):
        return torch.zeros((), dtype=torch.bool)
    return true.abs() >= torch.finfo(dtype).max / 2


def summing_slack(size: torch.Tensor | None, tol: float) -> torch.Tensor | float:
    """``tol`` times the magnitudes a left side sums products of: a sum's rounding is bounded
    relative to its terms, not to its result, so where the terms cancel (a conv's output near 0
    after batch norm's mean is taken out) another summation order (the library's blocking, AVX2
    or AVX-512 kernels, a folded weight) moves the result by more than ``tol`` of itself."""
    return 0.0 if size is None else tol * size.nan_to_num(0.0, 0.0, 0.0)


#: torch's fused attention kernels' measured error, relative to sum_j p_j |v_j| (the weights times
#: the values' magnitudes): <= 1.3e-5 over 200 draws with scores up to ~1e2, whose rounding exp
#: amplifies. Where the weighted average cancels (0.002 of values ~1) that is 0.2% of the output,
#: so a right side running such a kernel is held to this bound on that scale as well (8x margin)
ATTENTION_ERROR = 1e-4


def attention_slack(rule, left: Term, env: dict) -> torch.Tensor | float:
    """ATTENTION_ERROR times the left side evaluated on the values' magnitudes (softmax(...) @ |v|)
    where the rule's right side runs torch's attention kernel (an op of attention's shape: sdpa,
    sdpa_masked, sdpa_filled, sdpa_guarded); else 0."""
    values = set()
    attention = [name for name, op in OPS.items() if op.shape_rule == "sdpa"]
    for _, right in rule.pairs():
        values |= set().union(*(_uses(right, op, 2) for op in attention))
    if not values:
        return 0.0
    size = {k: v.abs() if k in values else v for k, v in env.items()}
    (out,) = evaluate([left], size, reference=True)
    return ATTENTION_ERROR * torch.as_tensor(out).abs().nan_to_num(0.0, 0.0, 0.0)


def violations(lhs, rhs, true, tol: float, finite_inputs: torch.Tensor,
               sign: torch.Tensor | None = None, spill: torch.Tensor | None = None,
               slack: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Where the right side breaks the rule's contract with the left side (see the module doc).
    Where float64 itself overflowed on finite inputs, its value is no truth: the right side may
    then equal the left side or be finite (softmax of a row of float32 max: 1/n, not NaN). Where
    ``spill`` (see order_free), the right side may overflow as well."""
    dtype = lhs.dtype
    left, right = torch.broadcast_tensors(lhs.double(), torch.as_tensor(rhs).double())
    true = torch.broadcast_to(true, left.shape)
    held = true.to(dtype).double()  # the truth as the dtype holds it: inf on overflow, signed 0
    fi = torch.finfo(dtype)
    tol = max(tol, 4 * fi.eps)  # a half-precision output rounds at ~1e-3 (float16), ~8e-3 (bfloat16)
    scale = torch.maximum(left.abs(), right.abs())
    gap, err_left, err_right = (right - left).abs(), (left - true).abs(), (right - true).abs()
    close = (gap <= tol * scale + fi.tiny + slack) | (err_right <= err_left + tol * true.abs() + fi.tiny)
    at_overflow = right.isinf() & (right.sign() == true.sign()) & (true.abs() >= fi.max * (1 - tol))
    finite_ok = (right.isfinite() & close) | at_overflow  # rounding across the largest finite value
    same = (right == left) | (right.isnan() & left.isnan())
    toward = torch.where(held.isfinite(), right.isfinite() & (err_right <= tol * true.abs() + fi.tiny),
                         (right == held) | (right.isnan() & held.isnan()))
    unknown = ~true.isfinite() & right.isfinite() & finite_inputs
    ok = torch.where(left.isfinite(), finite_ok, same | toward | unknown)
    if spill is not None:
        ok |= torch.broadcast_to(spill, left.shape) & ~right.isfinite()
    zeros = (left == 0) & (right == 0) & (true == 0)  # an exact zero: its sign is meaningful
    sign_kept = (left.signbit() == right.signbit()) | (held.signbit() == right.signbit())
    if sign is not None:  # or the sign the real function has there (see ZERO_PROXIES)
        sign = torch.broadcast_to(sign, left.shape)
        sign_kept |= (sign != 0) & ((sign < 0) == right.signbit())
    return ~(ok & (~zeros | sign_kept))


def _tolerance(rule, dtype) -> float:
    return TOLERANCE[dtype] * (APPROX_FACTOR if rule.exactness is Exactness.APPROX else 1)


def check(rule, values: dict, env: dict, dtype, mask=None) -> list[str]:
    """Failures (as text) of every root of the rule at the bound point."""
    failures = []
    for left, right in all_sides(rule, values):
        lhs, rhs = (torch.as_tensor(v) for v in evaluate([left, right], env))
        finite_inputs = torch.ones((), dtype=torch.bool)
        for v in (v for v in env.values() if v.is_floating_point()):
            finite = v.isfinite()  # per element where the point is an element (elementwise rules)
            finite_inputs = finite_inputs & (finite if finite.shape == lhs.shape else finite.all())
        size = magnitudes(left, env)
        zeros = bool(((lhs == 0) & (rhs == 0)).any())  # the real function's sign matters only at a zero of both
        true, spill = truth(left, env), order_free(size, lhs.dtype)
        sign = limit_sign(left, env) if zeros else None
        spill = spill | kernel_overflow(right, true, lhs.dtype)
        slack = attention_slack(rule, left, env) + summing_slack(size, _tolerance(rule, dtype))
        bad = violations(lhs, rhs, true, _tolerance(rule, dtype), finite_inputs, sign, spill, slack)
        if bad.any():  # where float64 is no truth itself, and the left side has an exact one
            exact = exact_truth(left, env, true, bad)
            if exact is not None:
                true = exact
                bad = violations(lhs, rhs, true, _tolerance(rule, dtype), finite_inputs, sign, spill,
                                 slack)
                # undefined over the reals (sqrt of a negative that rounds to -0 on the left)
                bad &= ~(true.isnan() & torch.as_tensor(rhs).isnan())
            else:  # where float64 cancels in one side (x - logsumexp(x) at x = float32 max is
                # 0 there, -log(n) exactly), it cannot tell which is right: the other side's
                # float64 value is as much a truth
                other = truth(right, env)
                bad &= violations(lhs, rhs, other, _tolerance(rule, dtype), finite_inputs, sign, spill,
                                  slack)
        if mask is not None:
            bad = bad & mask
        if bad.any():
            i = bad.flatten().nonzero()[0, 0]
            at = {k: v.flatten()[i].item() if v.shape == bad.shape else v.flatten()[:4].tolist()
                  for k, v in env.items() if v.is_floating_point()}
            attrs = {k: v for k, v in values.items() if not isinstance(v, Term)}
            lv, rv = torch.broadcast_tensors(lhs, rhs)
            failures.append(f"{rule.name} [{dtype}] at {at} {attrs}: left {lv.flatten()[i].item()}, "
                            f"right {rv.flatten()[i].item()}, truth {true.flatten()[i].item()}")
    return failures


def _folds(p) -> bool:
    """Whether a pattern computes an attribute (a constant fold)."""
    if isinstance(p, pat.Prim):
        return True
    return isinstance(p, pat.Node) and any(_folds(a) for a in p.args + p.attrs)


def _attribute_choices(rule, sorts):
    """Every combination of extreme values of the free f64 attributes of a rule that folds them
    (other rules' constants come from the proof sampler: moderate values)."""
    if not any(_folds(right) for _, right in rule.pairs()):
        return [{}]
    free = [v for v, s in sorts.items() if s == "f64" and v not in dict(rule.sample)]
    return [dict(zip(free, combo)) for combo in itertools.product(ATTRIBUTES, repeat=len(free))]


def scalar_failures(rule, dtype) -> list[str]:
    """An elementwise rule on 1-D tensors holding every combination of edge values."""
    sorts = {v: s for left, _ in rule.pairs() for v, s in pat.variables(left).items()}
    signs, _, rest = _facts(rule)
    names = sorted(v for v, s in sorts.items() if s == pat.TENSOR)
    columns = {v: [x for x in extremes(dtype) if v not in signs or SIGN_FACTS[signs[v]](x)]
               for v in names}
    grid = list(itertools.product(*(columns[v] for v in names)))
    env = {v: torch.tensor([p[i] for p in grid], dtype=dtype) for i, v in enumerate(names)}
    base, _ = bind(rule, torch.Generator().manual_seed(11), scale=1.0)
    failures = []
    for attrs in _attribute_choices(rule, sorts):
        values = {**base, **{v: Term.input(v, (len(grid),), str(dtype).removeprefix("torch."))
                             for v in names}, **attrs}
        mask = torch.ones(len(grid), dtype=torch.bool)
        try:
            for fact in rest:
                mask &= torch.as_tensor(holds(fact, values, env), dtype=torch.bool)
        except ZeroDivisionError:  # a guard's own arithmetic fails: the guard does not hold
            continue
        if mask.any():
            failures += check(rule, values, env, dtype, mask)
    return failures


def tensor_failures(rule, dtype) -> list[str]:
    """A rule over whole tensors: sampled moderate operands, then one edge value put at one
    element or over the whole of one operand at a time."""
    gen = torch.Generator().manual_seed(11)
    values, env = bind(rule, gen, scale=1.0)
    signs, dtypes, rest = _facts(rule)
    lhs = pat.Node("add", tuple(left for left, _ in rule.pairs()), ())
    special = _index_vars(lhs) | _uses(lhs, "where", 0)
    # operands the guards do not type share the type they pin (a float16 matmul's both operands)
    pinned = set(dtypes.values())
    common = pinned.pop() if len(pinned) == 1 else dtype
    env = {k: v.to(dtypes.get(k, common)) if v.is_floating_point() else v for k, v in env.items()}
    for k, v in env.items():
        if isinstance(values.get(k), Term) and values[k].op == "input":
            values[k] = Term.input(k, tuple(v.shape), str(v.dtype).removeprefix("torch."))
    failures = []
    floating = [k for k, v in env.items() if v.is_floating_point() and k not in special]
    edges = [(name, x) for name in floating for x in extremes(env[name].dtype)]  # each its own type's
    for (name, x), whole in itertools.product(edges, (False, True)):
        if name in signs and not SIGN_FACTS[signs[name]](x):
            continue
        point = dict(env)
        edge = point[name].clone()
        edge.view(-1)[slice(None) if whole else slice(0, 1)] = x
        point[name] = edge
        if all(bool(torch.as_tensor(holds(f, values, point)).all()) for f in rest):
            failures += check(rule, values, point, dtype)
    return failures


CASES = [(r, torch.float32) for r in RULES] + [(r, torch.float16) for r in SCALAR_RULES]


def _ops(p) -> set[str]:
    return {t.op for t in postorder([pat.skeleton(p)[0]]) if t.op != "opaque"}


#: elementwise rules sympy cannot read (where, less, maximum, hypot...): tensor_failures tries one
#: edge value at a time, so these also get every combination of edges, as the scalar rules do
ELEMENTWISE_RULES = [r for r in RULES if r not in SCALAR_RULES and r.exactness is not Exactness.APPROX
                     and len(r.pairs()) == 1
                     and all(o in ELEMENTWISE or o == "const" for o in _ops(r.lhs_pattern) | _ops(r.rhs_pattern))
                     and set(pat.variables(r.lhs_pattern).values()) <= {pat.TENSOR, "f64"}]


def test_the_where_rules_are_among_the_elementwise_ones():
    assert {"quadratic-numerator-plus", "pow-shift-minus-one-where", "product-by-sum-of-squares"} <= {
        r.name for r in ELEMENTWISE_RULES}


@pytest.mark.parametrize("rule,dtype", [(r, d) for r in ELEMENTWISE_RULES for d in (torch.float32, torch.float16)],
                         ids=lambda c: getattr(c, "name", str(c)[6:]))
def test_elementwise_rule_holds_at_every_combination_of_edges(rule, dtype):
    failures = scalar_failures(rule, dtype)
    assert not failures, "\n".join(failures[:5])


@pytest.mark.parametrize("rule,dtype", CASES, ids=lambda c: getattr(c, "name", str(c)[6:]))
def test_rule_holds_at_the_edges_of_floating_point(rule, dtype):
    scalar = rule in SCALAR_RULES
    failures = scalar_failures(rule, dtype) if scalar else tensor_failures(rule, dtype)
    assert not failures, "\n".join(failures[:5])


#: a tensor rule guarded to scale by a power of two (a GEMM's alpha and beta): the scales at float32's ends
SCALED = [r for r in RULES if r not in SCALAR_RULES and POWER_OF_TWO in map(str, r.when)]


@pytest.mark.parametrize("scale", [2.0 ** -126, 2.0 ** -100, -0.5, 8.0, 2.0 ** 100, -(2.0 ** 127)])
@pytest.mark.parametrize("rule", SCALED, ids=lambda r: r.name)
def test_a_power_of_two_scale_holds_at_its_extremes(rule, scale):
    rule = dataclasses.replace(rule, sample=tuple((v, scale if v == "c" else x) for v, x in rule.sample))
    failures = tensor_failures(rule, torch.float32)
    assert not failures, "\n".join(failures[:5])


def test_the_linear_scale_is_among_the_scaled_rules():
    assert "linear-scale-fuse" in {r.name for r in SCALED}


def _scalar(v: float) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.float32)


#: reported bugs (issue 13): (rule, tensor values, attributes) where the rule was wrong; now each
#: guard refuses the point or the right side is right there
REPORTED = [
    ("exp-difference", {"a": 80.0, "b": -110.0}, {}),     # exp(-110) * expm1(190) = 0 * inf
    ("exp-difference", {"a": -INF, "b": -INF}, {}),       # expm1(-inf - -inf) = NaN; truth 0
    ("mul-const-fold", {"x": 0.0}, {"a": 1e30, "b": 1e30}),  # x * 1e60 = 0 * inf in float32
    ("div-const-to-mul", {"x": 0.0}, {"c": 1e-39}),        # x * inf
    ("add-zero", {"x": -0.0}, {}),                         # 1 / (x + 0) is +inf, 1 / x -inf
    ("sub-to-neg", {"x": 0.0}, {}),                        # 0 - 0 = +0, -0 = -0
]


@pytest.mark.parametrize("name,point,attrs", REPORTED, ids=[f"{n}-{i}" for i, (n, *_) in enumerate(REPORTED)])
def test_reported_rule_bugs_stay_fixed(name, point, attrs):
    from egraph_opt.rulesets import catalogue

    rule = catalogue()[name]
    env = {v: _scalar(x) for v, x in point.items()}
    values = {**{v: Term.input(v, (1,)) for v in point}, **attrs}
    signs, _, rest = _facts(rule)
    try:
        guarded = all(SIGN_FACTS[s](point[v]) for v, s in signs.items()) and all(
            bool(torch.as_tensor(holds(f, values, env)).all()) for f in rest)
    except ZeroDivisionError:
        guarded = False
    assert not guarded or not check(rule, values, env, torch.float32)


def test_fused_softmax_agrees_with_the_naive_quotient_at_inf():
    """exp(x) / sum(exp(x)) on [inf, 1, 2] is [nan, 0, 0]; the op must not make the row NaN."""
    x = Term.input("x", (3,))
    naive = Term("div", (Term("exp", (x,)), Term("sum", (Term("exp", (x,)),), (-1, True))))
    for row in ([INF, 1.0, 2.0], [INF, -INF, 1.0], [NAN, 1.0, 2.0], [-INF, -INF, 1.0], [1.0, 2.0, 3.0]):
        env = {"x": torch.tensor(row)}
        got, want = evaluate([Term("softmax", (x,), (-1,)), naive], env)
        if torch.isfinite(torch.tensor(row)).all():
            torch.testing.assert_close(got, want)
        else:
            torch.testing.assert_close(got, want, equal_nan=True)


def test_log_quotient_fires_only_where_the_quotient_can_leave_the_dtype():
    """log(a/b) -> log a - log b where a/b may overflow or underflow; with a and b both in [1, 2]
    it would only cancel, so it must not fire."""
    from egraph_opt.rulesets import catalogue
    from test_rule_catalogue import _classes_after

    rule, x, y = catalogue()["log-quotient"], Term.input("x", (3,)), Term.input("y", (3,))
    near = lambda t: Term("add", (Term("sigmoid", (t,)), Term.const(1.0)))  # noqa: E731
    quotient = lambda a, b: Term("log", (Term("div", (a, b)),))  # noqa: E731
    assert _classes_after([rule], quotient(near(x), near(y)), ranged=True) == {"log"}
    assert _classes_after([rule], quotient(Term("exp", (x,)), near(y)), ranged=True) == {"log", "sub"}


def test_a_sum_that_overflows_only_after_a_scale_moved_out_is_still_wrong():
    """order_free excuses an overflow only where the left side's own terms add up past the max:
    (a * 0.25) @ b is finite (1e38) where (a @ b) * 0.25 overflows, and that is reported."""
    from egraph_opt.rulesets import catalogue

    rule = catalogue()["matmul-scale-left-out"]
    env = {"a": torch.tensor([[2e38, 2e38]]), "b": torch.ones(2, 1)}
    values = {"a": Term.input("a", (1, 2)), "b": Term.input("b", (2, 1)), "c": 0.25}
    assert check(rule, values, env, torch.float32)
    assert not check(rule, {**values, "c": 4.0}, env, torch.float32)  # both overflow: order's accident
