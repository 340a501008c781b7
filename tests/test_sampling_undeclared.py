"""Undeclared inputs are sampled as Herbie samples them (issue 16 item 3): uniformly over the bit
patterns of their dtype's finite numbers, so the form accurate on more of the dtype wins."""
import torch

from egraph_opt import optimize, pretty
from egraph_opt.analysis.sampling import sample_inputs
from egraph_opt.extractors import Objective
from egraph_opt.extractors.rounding_error import ordinal, rounding_error
from egraph_opt.lang.program import Program
from egraph_opt.lang.term import Term

X = Term.input("x", (4, 16))
ONE = Term.const(1.0)
NAIVE = Term("sub", (Term("sqrt", (Term("add", (X, ONE)),)), Term("sqrt", (X,))))


def test_an_undeclared_input_is_uniform_over_its_bit_patterns():
    gen = torch.Generator().manual_seed(0)
    env = sample_inputs({"x": ((64, 256), "float32"), "h": ((64, 256), "float16")}, {}, gen)
    for name, dtype in (("x", torch.float32), ("h", torch.float16)):
        v = env[name]
        assert v.dtype == dtype and v.isfinite().all()
        order = ordinal(v.double(), dtype).double()
        top = float(ordinal(torch.tensor([torch.finfo(dtype).max], dtype=torch.float64), dtype))
        # uniform ordinals: a quarter of the points in each quarter of [-top, top]
        quarters = torch.histc(order, bins=4, min=-top, max=top) / order.numel()
        assert ((quarters - 0.25).abs() < 0.02).all(), (name, quarters)
        assert 0.45 < (v.abs() < 1).float().mean() < 0.55  # half the numbers are below 1
    assert env["x"].abs().max() < torch.finfo(torch.float32).max  # no end drawn on purpose


def test_a_declared_range_keeps_its_ends_and_row_kinds():
    gen = torch.Generator().manual_seed(0)
    v = sample_inputs({"x": ((8, 16), "float32")}, {"x": (-1.0, 3.0)}, gen)["x"]
    assert v.min() == -1 and v.max() == 3


def test_an_undefined_element_does_not_poison_the_others():
    """sqrt(-1) in one element: its NaN derivative (0 * NaN in the other rows of the Jacobian)
    must not count as an infinite error of the defined elements."""
    env = {"x": torch.tensor([[-1.0, 1e30, 0.5, 2.0] * 4] * 4)}
    bits = rounding_error(NAIVE, env).bits.reshape(4, 16)
    assert bits[:, 0::4].isnan().all()
    assert (bits[:, 2::4] <= 2).all() and (bits[:, 3::4] <= 2).all()


def test_sqrt_difference_comes_back_rationalized_with_no_ranges_declared():
    result = optimize(Program((X,), NAIVE), objective=Objective.STABILITY)
    out = pretty(result.program.roots()[0])
    assert out.startswith("1.0 / (sqrt(") and "+ sqrt(x)" in out, out
