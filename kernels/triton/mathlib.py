"""Device functions that ``triton.language`` lacks or gets wrong for us, shared by the kernels.

Triton has no portable log1p, expm1, tanh, pow, hypot, atan or the hyperbolic functions (they live in CUDA's libdevice,
which the CPU interpreter cannot run), so they are built from exp and log with Kahan's compensation tricks: accurate to
a few ulps at every magnitude, on the GPU and in the interpreter alike. ReLU keeps NaN, as torch does. All take and
return float32 blocks."""
import triton
import triton.language as tl

LARGE, SMALLEST_NORMAL = tl.constexpr(2.0 ** 32), tl.constexpr(1.1754943508222875e-38)
DOWN, UP = tl.constexpr(2.0 ** -64), tl.constexpr(2.0 ** 64)  # the sum at 2^-64: where x's overflows

@triton.jit
def log1p(x):
    u = 1.0 + x
    r = tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))  # log(u) * x / (u - 1): exact ratio
    return tl.where(x > 1.0e30, tl.log(x), r)  # x / (u - 1) is inf / inf at x = inf


@triton.jit
def expm1(x):
    u = tl.exp(x)
    um1 = u - 1.0
    r = tl.where(u == 1.0, x, um1 * (x / tl.log(u)))  # (u - 1) * x / log(u): Kahan
    r = tl.where(um1 == -1.0, -1.0, r)
    return tl.where(x > 50.0, u, r)  # u - 1 == u there, and u may be inf


@triton.jit
def tanh(x):
    e = expm1(-2.0 * tl.abs(x))  # in (-1, 0]: no overflow, no cancellation near 0
    t = -e / (2.0 + e)
    return tl.where(x < 0.0, -t, tl.where(x == 0.0, x, t))  # x itself at -0: t is +0 there


@triton.jit
def power(a, b):
    """a ** b as torch computes it: negative bases allowed for integral exponents, x ** 0 = 1. In float64,
    rounded once: in a's own precision, b log a errs by |b log a| ulps (30 at 1e5 ** 0.3), which exp keeps."""
    integral = b == tl.floor(b)
    odd = integral & (tl.floor(b * 0.5) * 2.0 != b)
    # |a| for integral b (and -inf: C's pow); otherwise a itself, whose log is NaN when a < 0. Nested wheres, not &:
    # a and b may be a block and a scalar, which the interpreter cannot combine with &.
    r = tl.exp(b * tl.log(tl.where(integral, tl.abs(a), tl.where(a == float("-inf"), -a, a)).to(tl.float64))).to(tl.float32)
    r = tl.where(odd, tl.where(a < 0.0, -r, tl.where(1.0 / tl.where(a == 0.0, a, 1.0) < 0.0, -r, r)), r)  # (-0) ** -1: -inf
    unit = tl.where(a == 1.0, 1.0, tl.where(tl.abs(b) == float("inf"), 1.0, r))  # 1 ** b, (-1) ** +-inf: C's pow
    return tl.where(b == 0.0, 1.0, tl.where(tl.abs(a) == 1.0, unit, r))


@triton.jit
def copysign(a, b):
    mag = tl.abs(a)
    bits = tl.where(mag == mag, b, b).to(tl.int32, bitcast=True)  # b (maybe a scalar argument) as a block
    return tl.where(bits < 0, -mag, mag)  # b's sign bit: -0.0's and NaN's too


@triton.jit
def logaddexp(a, b):
    """log(e^a + e^b) as the larger plus log1p(e^-|a - b|): no overflow; the larger where it is infinite."""
    big = tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    return tl.where(tl.abs(big) == float("inf"), big, big + log1p(tl.exp(tl.where(a == b, 0.0, -tl.abs(a - b)))))


@triton.jit
def hypot(a, b):
    """sqrt(a^2 + b^2) scaled by the larger magnitude: no overflow or underflow; NaN where an operand is (ops.hypot)."""
    big, small = tl.maximum(tl.abs(a), tl.abs(b), propagate_nan=tl.PropagateNan.ALL), tl.minimum(tl.abs(a), tl.abs(b))
    r = small / tl.where(big == 0.0, 1.0, big)
    return tl.where(big == float("inf"), big, big * tl.sqrt_rn(1.0 + r * r))


@triton.jit
def sinh(x):
    """Odd: from expm1 below |x| = 20 (no cancellation near 0), else (e^(|x|/2) / 2) e^(|x|/2): finite to float32's max."""
    a = tl.abs(x)
    e, t = expm1(a), tl.exp(0.5 * a)
    return copysign(tl.where(a > 20.0, (0.5 * t) * t, 0.5 * (e + e / (e + 1.0))), x)


@triton.jit
def cosh(x):
    a = tl.abs(x)
    e, t = tl.exp(a), tl.exp(0.5 * a)
    return tl.where(a > 20.0, (0.5 * t) * t, 0.5 * (e + 1.0 / e))


@triton.jit
def asinh(x):
    """Odd: log1p(|x| + x^2 / (1 + sqrt(1 + x^2))) (exact near 0), past 2^28 log |x| + log 2 (before x^2 overflows)."""
    a = tl.abs(x)
    r = tl.where(a > 2.0 ** 28, tl.log(a) + 0.6931471805599453, log1p(a + a * a / (1.0 + tl.sqrt_rn(1.0 + a * a))))
    return copysign(r, x)


@triton.jit
def acosh(x):
    t = x - 1.0  # exact near 1
    return tl.where(x > 2.0 ** 28, tl.log(x) + 0.6931471805599453, log1p(t + tl.sqrt_rn(t * (x + 1.0))))


@triton.jit
def atanh(x):
    a = tl.abs(x)
    return copysign(0.5 * log1p(2.0 * a / (1.0 - a)), x)  # odd; log1p: exact near 0


@triton.jit
def atan(x):
    """Odd: |x| reduced to r in [0, tan(pi/8)] (-1 / |x| past tan(3pi/8), (|x| - 1) / (|x| + 1) past tan(pi/8)), then
    r + r^3 P(r^2), P fitted minimax to atan there (relative error 2e-8 before rounding), plus pi/2 or pi/4."""
    a = tl.abs(x)
    far, mid = a > 2.414213562373095, a > 0.4142135623730950
    r = tl.where(far, -1.0 / a, tl.where(mid, (a - 1.0) / (a + 1.0), a))
    z = r * r
    p = (((0.08053730626070953 * z - 0.13877681424726754) * z + 0.1997771030768632) * z - 0.33332949147858415) * z * r
    return copysign(tl.where(far, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0)) + (p + r), x)


@triton.jit
def round_half_even(x):
    f = tl.floor(x)
    d = x - f  # exact below 2^23, where x has a fraction
    up = (d > 0.5) | ((d == 0.5) & (f - 2.0 * tl.floor(0.5 * f) == 1.0))
    return copysign(tl.where(tl.abs(x) < 8388608.0, f + tl.where(up, 1.0, 0.0), x), x)  # -0.3: -0.0


@triton.jit
def relu(x):
    return tl.where(x < 0.0, 0.0, x)


@triton.jit
def gelu(x, APPROXIMATE: tl.constexpr):
    """torch.nn.functional.gelu; ``APPROXIMATE`` is its ``approximate`` argument ('none', 'tanh')."""
    if APPROXIMATE == "tanh":
        return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))  # sqrt(2/pi)
    else:
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))  # 1/sqrt(2)


@triton.jit
def activate(x, ACTIVATION: tl.constexpr):
    """The activations of ``linear_act``: 'none', 'relu', 'gelu' (erf) and 'gelu_tanh'."""
    if ACTIVATION == "relu":
        return relu(x)
    elif ACTIVATION == "gelu":
        return gelu(x, "none")
    elif ACTIVATION == "gelu_tanh":
        return gelu(x, "tanh")
    else:
        return x


@triton.jit
def max_keep_nan(acc):
    """The max of a block, NaN if any lane is NaN (torch.amax's rule; tl.max may drop NaN)."""
    has_nan = tl.max((acc != acc).to(tl.int32), 0) > 0
    return tl.where(has_nan, float("nan"), tl.max(acc, 0))


@triton.jit
def logsumexp_step(mx, s, x):
    """A row's running max ``mx`` and sum ``s`` of exp(x - mx) with one more block ``x`` (-inf off
    the row), in float32: the max NaN once a NaN is seen (so is all derived from it, as in torch), the
    shift 0 while the max is -inf (a block of -inf adds exp(-inf) = 0, not exp(-inf - -inf) = NaN)."""
    new = tl.maximum(mx, max_keep_nan(x), propagate_nan=tl.PropagateNan.ALL)
    shift = tl.where(new == float("-inf"), 0.0, new)
    return new, s * tl.exp(mx - shift) + tl.sum(tl.exp(x - shift), 0)


@triton.jit
def softmax_of(x, mx, s):
    """Softmax at ``x`` in a row of max ``mx`` and sum ``s``; a max of +inf: NaN at +inf, else 0 (ops.softmax)."""
    return tl.where(mx == float("inf"), tl.where(x == float("inf"), float("nan"), 0.0), tl.exp(x - mx) / s)


@triton.jit
def moments_step(acc, low, top, x):
    """A row's lanes' running sums ``acc``, the same at 2^-64 ``low`` and largest |x| ``top`` with one
    more block ``x`` (0 off the row): what ``scaled_mean`` reads."""
    return acc + x, low + x * DOWN, tl.maximum(top, tl.abs(x))


@triton.jit
def scaled_mean(acc, low, top, n):
    """(mean of x * scale, scale) of a row of ``n``: rows past 2^32 are scaled by a power of two (squares overflow)."""
    top = tl.max(top, 0)
    scale = tl.where(top > LARGE, tl.exp2(-tl.ceil(tl.log2(top))), 1.0)
    total = tl.sum(acc, 0)
    return tl.where(tl.abs(total) < float("inf"), total * scale, tl.sum(low, 0) * (UP * scale)) / n, scale


@triton.jit
def scaled_rstd(acc, n, eps, scale):
    """1 / std of a row of ``n`` from its lanes' squared deviations of x * scale, ``eps`` scaled alike (no 0)."""
    eps = tl.maximum(eps * scale * scale, tl.where(eps > 0, SMALLEST_NORMAL, 0.0))
    return 1.0 / tl.sqrt_rn(tl.sum(acc, 0) / n + eps)
