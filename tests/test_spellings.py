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
NOT_YET = {
    "gpt2-eager": "canonical: where(causal, w, finfo.min) as a mask kind (equal to -inf masking "
                  "only where a row keeps a key)",
    "gpt2-where-float": "canonical: where(m, w, finfo.min) as a mask kind",
    "softmax-type-as": "canonical: softmax between casts to float32 and back as sdpa's own float32 "
                       "accumulation (as softmax-float32-in-float16)",
    "f-rms-norm": "frontend: F.rms_norm stays opaque (lower it to rms_norm)",
    "softmax-float32-in-float16": "canonical: softmax between casts to float32 and back as sdpa's "
                                  "own float32 accumulation (unsound where float16 scores overflow: "
                                  "needs proved ranges on q, k)",
    "llama-rms-norm": "op: rms_norm, and its fusion from x * rsqrt(mean(x^2) + eps)",
    "t5-layer-norm": "op: rms_norm, and its fusion from x * rsqrt(mean(x^2) + eps)",
    "gemma-rms-norm": "op: rms_norm, and its fusion from x * rsqrt(mean(x^2) + eps)",
    "rms-div-sqrt": "op: rms_norm, and its fusion from x * rsqrt(mean(x^2) + eps)",
    "quick-gelu-sigmoid": "x * sigmoid(1.702 x) is within 2e-2 of gelu, not 1e-3: needs an "
                          "approximation class chosen only under a tolerance",
}


@functools.cache
def optimized(name: str):
    """(optimized output, original output, report) of one spelling, optimized once, priced by
    static estimates (whether a fusion pays on this machine is bench/fusion.py's question)."""
    fn, args = SUITE[name].make(T)
    f = saturate_and_extract(fn, profile_db=False)  # static estimates: no machine's timings
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*args), fn(*args), f.report


def _tolerance(out: torch.Tensor) -> float:
    return 1e-2 if out.dtype in (torch.float16, torch.bfloat16) else 2e-4


def test_suite_is_as_large_as_the_issue_asks():
    counts = {f: sum(s.family == f for s in SUITE.values()) for f in FAMILIES}
    assert counts["attention"] >= 25 and counts["norm"] >= 10 and counts["gelu"] >= 10, counts
    assert set(NOT_YET) <= set(SUITE)


@pytest.mark.parametrize("name", SUITE, ids=str)
def test_spelling_validates(name):
    out, ref, report = optimized(name)
    assert not report.fallback, report.fallback
    tol = _tolerance(ref)
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=NOT_YET[n], strict=True))
                                  if n in NOT_YET else n for n in SUITE], ids=str)
def test_spelling_fuses(name):
    _, _, report = optimized(name)
    fused = SUITE[name].fuses
    assert any(op in report.ops_after for op in fused), f"none of {fused} in {report.ops_after}"
    if SUITE[name].family == "attention":
        assert "softmax" not in report.ops_after, report.ops_after
