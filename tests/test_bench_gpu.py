"""bench/gpu.py --interpret: the GPU benchmark's whole path (Triton kernels against torch's, the
decorator end to end in a child process, the markdown it writes) at tiny sizes on CPU, Triton
interpreted; its timings mean nothing, its errors and bound kernels do."""
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench", "gpu.py")


def test_the_gpu_benchmark_runs_interpreted_on_cpu(tmp_path):
    out = tmp_path / "gpu.md"
    done = subprocess.run([sys.executable, BENCH, "--interpret", "--only", "programs", "kernels",
                           "--programs", "naive_softmax float16", "--seconds", "500", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert "# bench/gpu.py on CPU (Triton interpreted)" in text
    program = next(line for line in text.splitlines() if line.startswith("| naive_softmax float16"))
    # softmax between its casts is one fused Triton kernel; which one (the generated or the library softmax)
    # is chosen by timing interpreted kernels, so either is right here
    bound = [cell.strip() for cell in program.split("|") if cell.strip().startswith("triton.")]
    assert bound in (["triton.generated x1"], ["triton.softmax x1"]) and "failed" not in program, program
    section = text.split("## Triton kernels against torch's")[1]
    kernels = [line for line in section.splitlines() if line.startswith("| ") and "float" in line]
    assert len(kernels) >= 9 * 3, text  # every kernel case in three dtypes
    assert {row.split("|")[1].strip() for row in kernels} >= {"cross_entropy", "sdpa causal", "layer_norm"}
    for row in kernels:
        error = float(row.split("|")[4])
        assert error < 1e-2, row  # every kernel within its dtype's rounding of float64


def test_the_gpu_benchmark_names_an_unknown_program():
    done = subprocess.run([sys.executable, BENCH, "--interpret", "--only", "programs", "--programs", "nope"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "no program 'nope'" in done.stderr
