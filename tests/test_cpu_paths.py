"""torch picks its CPU kernels by the vector instructions the CPU has (scalar, AVX2, AVX-512);
``ATEN_CPU_CAPABILITY`` forces a lower path, so the verdicts that once differed between CPUs (a
NaN's sign bit, gelu's tanh path) are checked on every path from any one machine."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _passes(capability: str, files: list[str], selection: str) -> None:
    # oneDNN (the fused linear epilogues) picks its own vector path: capped alike
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "ONEDNN_MAX_CPU_ISA": "AVX2" if capability == "avx2" else "ALL"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          *(os.path.join(HERE, f) for f in files), "-k", selection],
                         env=env, cwd=os.path.dirname(HERE), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_rewritten_kernels_and_rules_hold_on_every_cpu_vector_path(capability):
    """The rewritten kernels at the edges, and the rules that move an op across a cast at the extremes
    (float32 sinh and cosh overflow past half the max on AVX2's vector path only, e^|x| first): one
    process per path, on any CPU."""
    _passes(capability, ["test_kernels.py", "test_ops.py", "test_rule_extremes.py"],
            "match_their_reference_term_at_the_edges or linear_add or linear_at_overflow or before-rounding")
