"""The real value of an elementwise term, computed exactly (mpmath): a truth no CPU's libm or
summation order moves, for tests that judge accuracy (the extremes test, a stability rule's purpose)."""
import mpmath
import torch

from egraph_opt.lang.term import Term, postorder


def _mp_sigmoid(x):
    return 1 / (1 + mpmath.exp(-x))


def _mp_gelu(x, approximate):
    if approximate == "tanh":
        return x * (1 + mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * (x + 0.044715 * x ** 3))) / 2
    return x * (1 + mpmath.erf(x / mpmath.sqrt(2))) / 2


#: elementwise ops over the reals (a cast is exact there, as in the reference)
MP = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
      "div": lambda a, b: a / b, "pow": lambda a, b: a ** b, "neg": lambda a: -a,
      "exp": mpmath.exp, "log": mpmath.log, "log1p": mpmath.log1p, "expm1": mpmath.expm1,
      "sqrt": mpmath.sqrt, "rsqrt": lambda a: 1 / mpmath.sqrt(a), "abs": abs, "sin": mpmath.sin,
      "cos": mpmath.cos, "tanh": mpmath.tanh, "sigmoid": _mp_sigmoid, "erf": mpmath.erf,
      "relu": lambda a: max(a, 0), "softplus": lambda a: mpmath.log1p(mpmath.exp(a)),
      "gelu": _mp_gelu, "maximum": max, "minimum": min, "cast": lambda a, _: a,
      "logaddexp": lambda a, b: mpmath.log(mpmath.exp(a) + mpmath.exp(b)), "tan": mpmath.tan,
      "atan": mpmath.atan, "atan2": mpmath.atan2, "hypot": mpmath.hypot, "asinh": mpmath.asinh,
      "acosh": mpmath.acosh, "atanh": mpmath.atanh, "cbrt": lambda a: mpmath.sign(a) * mpmath.cbrt(abs(a)),
      "sinh": mpmath.sinh, "copysign": lambda a, b: abs(a) if b >= 0 else -abs(a)}
MP_DIGITS = 120  # digits of the exact truth: 1 - cos x at the least float32 subnormal needs ~100


def mp_value(term: Term, point: dict):
    """The term's real value at a point (mpf), NaN outside its domain, None where undefined."""
    values = {}
    for t in postorder([term]):
        if t.op == "const":
            values[id(t)] = mpmath.mpf(t.attrs[0])
        elif t.op == "input":
            values[id(t)] = point[t.attrs[0]]
            continue
        else:
            args = [values[id(a)] for a in t.args]
            if t.op == "pow" and (args[0] == 1 or args[1] == 0):  # IEEE's pow(1, y) and pow(x, 0): 1, NaN or not
                values[id(t)] = mpmath.mpf(1)
                continue
            if any(mpmath.isnan(a) for a in args):
                values[id(t)] = mpmath.nan
                continue
            try:
                out = MP[t.op](*args, *t.attrs)
            except ZeroDivisionError:
                return None
            values[id(t)] = out if isinstance(out, mpmath.mpf) else mpmath.nan  # complex: no real value
    return values[id(term)]


def exact(term: Term, env: dict) -> torch.Tensor | None:
    """The term's real value at every element of ``env``'s tensors, rounded once to float64; None
    where an op has no form here (softmax, matmul: float64 is the truth there) or the term is
    undefined at some element (a division by 0)."""
    if any(t.op not in MP and t.op not in ("const", "input") for t in postorder([term])):
        return None
    names = [k for k, v in env.items() if v.is_floating_point()]
    shape = torch.broadcast_shapes(*(env[k].shape for k in names))
    flat = {k: torch.broadcast_to(env[k].double(), shape).flatten().tolist() for k in names}
    out = []
    with mpmath.workdps(MP_DIGITS):
        for i in range(len(next(iter(flat.values()), [0.0]))):
            value = mp_value(term, {k: mpmath.mpf(flat[k][i]) for k in names})
            if value is None:
                return None
            out.append(float(value))
    return torch.tensor(out, dtype=torch.float64).reshape(shape)
