"""The public suite of spellings (bench/spellings.py, issue 17 item 5): each one, decorated with
saturate_and_extract, validates (no fallback, outputs equal to the original's) and fuses (the
optimized program holds the fused op). A spelling that does not fuse yet is a strict xfail naming
the missing piece; timing is bench/fusion.py's (``--suite``), not a test's."""
import functools
import sys
import warnings
from pathlib import Path

import pytest
import torch

from egraph_opt import saturate_and_extract

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from spellings import FAMILIES, SUITE  # noqa: E402

T = 8
#: spelling -> the piece that would make it fuse (a frontend lowering or a canonicalization)
NOT_YET: dict[str, str] = {}


@functools.cache
def optimized(name: str):
    """(optimized output, original output, report) of one spelling, optimized once, priced by
    static estimates (whether a fusion pays on this machine is bench/fusion.py's question)."""
    fn, args = SUITE[name].make(T)
    f = saturate_and_extract(fn, profile_db=False, profile_budget=0)  # static estimates, no timing verdict
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*args), fn(*args), f.report


def _tolerance(out: torch.Tensor) -> float:
    return 1e-2 if out.dtype in (torch.float16, torch.bfloat16) else 2e-4


def test_suite_is_as_large_as_the_issue_asks():
    counts = {f: sum(s.family == f for s in SUITE.values()) for f in FAMILIES}  # norm: LN and RMSNorm
    assert counts["attention"] >= 25 and counts["norm"] >= 10 and counts["gelu"] >= 10, counts
    assert set(NOT_YET) <= set(SUITE)


@pytest.mark.parametrize("name", SUITE, ids=str)
def test_spelling_validates(name):
    out, ref, report = optimized(name)
    assert not report.fallback, report.fallback
    tol = _tolerance(ref[0] if isinstance(ref, tuple) else ref)  # rotary: (q, k)
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=NOT_YET[n], strict=True))
                                  if n in NOT_YET else n for n in SUITE], ids=str)
def test_spelling_fuses(name):
    _, _, report = optimized(name)
    fused = SUITE[name].fuses
    assert any(op in report.ops_after for op in fused), f"none of {fused} in {report.ops_after}"
    if SUITE[name].family == "attention":
        assert "softmax" not in report.ops_after, report.ops_after


@pytest.mark.parametrize("rows", ["causal", "left-padded queries", "every key masked"])
def test_phis_float32_scores_fuse_no_less_accurate_where_the_mask_is_float16s_min(rows):
    """PhiAttention: q, k upcast, a float16 mask (-65504) added to the float32 scores, the weights rounded to float16
    before @ v. The plan computes them in float32 (the mask promotes the sum, so the rounding round-trips away) and
    fuses masked sdpa, rounding once: no less accurate than the original against float64, also where a row's every
    key holds -65504 (scores on float32's 2^-8 grid there, which both sides round alike)."""
    from spellings_sourced import phi_upcast
    gen, t = torch.Generator().manual_seed(5), 8
    q, k, v = (torch.randn(2, 4, t, 16, generator=gen).half() for _ in range(3))
    causal = torch.zeros(1, 1, t, t, dtype=torch.float16).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1),
                                                                      torch.finfo(torch.float16).min)
    f = saturate_and_extract(phi_upcast, profile_db=False, profile_budget=0)
    mask = {"causal": causal, "left-padded queries": causal.clone().index_fill_(2, torch.tensor([0, 3]), -65504),
            "every key masked": torch.full_like(causal, -65504)}[rows]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = f(q, k, v, mask)
    assert "sdpa_masked" in f.report.ops_after and not f.report.fallback, f.report
    truth = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 4 + mask.double(), -1) @ v.double()
    left, right = ((x.double() - truth).abs() for x in (phi_upcast(q, k, v, mask), out))
    assert right.mean() <= 1.1 * left.mean() and right.max() <= left.max() + 2 ** -10, (left, right)
