"""The report says where declaring an input's range would let a guarded rule fire: the rule, the
input, the range its guard needs; and says nothing where a range would not help."""
import torch

from egraph_opt import saturate_and_extract


def cancelling(x):
    return torch.sqrt(x + 1) - torch.sqrt(x)


def _report(fn, *args, **options):
    optimized = saturate_and_extract(fn, profile_budget=0, **options)
    optimized(*args)
    return optimized.report


def test_an_undeclared_input_that_blocks_a_guard_is_named_with_the_range_it_needs():
    x = torch.rand(1000) * 1e6
    report = _report(cancelling, x)
    hints = [line for line in str(report).splitlines() if line.startswith("[RANGES]")]
    assert hints == ["[RANGES] sqrt-difference-general matched sqrt(x + 1.0) - sqrt(x); its guard needs "
                     "x in [5.96e-08, inf), x + 1.0 in [-3.403e+38, 3.403e+38], not proved: x has no declared "
                     "range. Pass input_ranges={'x': (lo, hi)} within which these hold"]
    declared = _report(cancelling, x, input_ranges={"x": (1, 1e6)})  # as the line says
    assert declared.ranges == [] and declared.rewrites and declared.error[1].worst < declared.error[0].worst


def test_every_input_is_named_and_a_declared_one_is_not():
    def log_of_product(x, y):
        return torch.log(x * y)
    x, y = torch.rand(8) + 1, torch.rand(8) + 1
    assert "x in (0, inf), y in (0, inf)" in _report(log_of_product, x, y).ranges[0]
    assert "x, y have no declared range" in _report(log_of_product, x, y).ranges[0]
    hint, = _report(log_of_product, x, y, input_ranges={"x": (1, 2)}).ranges
    assert "not proved: y has no declared range" in hint and "input_ranges={'y': (lo, hi)}" in hint


def test_no_hint_where_a_range_would_not_help():
    """add-negative-const's guard is the sign of a constant: x's range cannot prove it."""
    def shifted(x):
        return torch.exp(x + 3.0) * 2.0
    assert _report(shifted, torch.randn(8)).ranges == []
