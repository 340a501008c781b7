"""Hugging Face architectures exported by the dynamo exporter, optimized by the batch driver.

A dozen transformers models (tiny random-weight configs built in code, eval mode; see
tests/test_onnx_hf.py) exported by ``torch.onnx.export(dynamo=True)``, each optimized as exported
and with ``--opset 23``, as the ``egraph-opt`` CLI does. One row per model and pass: nodes before ->
after, the fused operators the optimized model holds (and how many the original held), the
driver's status (optimized, kept as it was because measured slower, or failed with its reason),
the worst validation error under onnxruntime, and the ORT latency ratio optimized / original
(interleaved medians of the wall clock, one thread; on a shared machine the figures are indicative).
Run: ``.venv/bin/python bench/onnx_hf.py [--only NAME ...] [--length T] [--runs N] [--profile-budget S]``
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))  # bench/ and tests/, never the root (its kernels/ hides
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]  # Hugging Face's, which transformers imports)

import onnx  # noqa: E402

from egraph_opt.drivers.onnx_batch import process  # noqa: E402
from egraph_opt.profiling.latency import default_budget  # noqa: E402
from onnx_zoo import driver_options  # noqa: E402
from test_onnx_hf import MODELS, export_model  # noqa: E402

FUSED = ("Attention", "LayerNormalization", "RMSNormalization", "SkipLayerNormalization", "Gelu",
         "RotaryEmbedding", "Softmax")
HEADER = f"{'model':<16} {'pass':<9} {'nodes':>10}  {'fused ops (original)':<44} {'max error':>9} {'ratio':>6}  status"


def fused(path_or_model) -> Counter:
    model = onnx.load(path_or_model) if isinstance(path_or_model, str) else path_or_model
    return Counter(n.op_type for n in model.graph.node if n.op_type in FUSED)


def row(name: str, path: str, target: str, opset: int | None, options: dict) -> str:
    """Optimize one exported model with the batch driver and describe the result in one line."""
    r = process(path, target, {**options, "opset": opset})
    label = "opset 23" if opset else "exported"
    if r["status"] != "optimized":
        return f"{name:<16} {label:<9} {'':>10}  failed: {r['reason']}"
    before = fused(path)
    after = fused(target) if "kept_original" not in r else before
    ops = ", ".join(f"{op} {after[op]} ({before[op]})" for op in FUSED if after[op] or before[op])
    nodes = f"{r['nodes_before']}->{r['nodes_after']}"
    ratio = (f"{r['latency_ms_after'] / r['latency_ms_before']:6.2f}" if r.get("latency_ms_before")
             else f"{'-':>6}")
    status = f"kept original: {r['kept_original']}" if "kept_original" in r else "optimized"
    return f"{name:<16} {label:<9} {nodes:>10}  {ops:<44} {r.get('max_error', 0.0):9.1e} {ratio}  {status}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=MODELS, help="these models only")
    parser.add_argument("--length", type=int, default=32, help="sequence length T of the text models")
    parser.add_argument("--runs", type=int, default=100, help="interleaved timed runs per model and pass")
    parser.add_argument("--profile-budget", type=float, default=default_budget(),
                        help="seconds per model of kernel profiling, as the CLI's (0: static estimates)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        options = driver_options(folder, args.runs, args.profile_budget)
        print(f"T={args.length}\n{HEADER}")
        for name in args.only or MODELS:
            try:
                path = export_model(name, Path(folder), args.length)
            except Exception as e:  # noqa: BLE001 - the exporter's failures, one line per model
                print(f"{name:<16} {'':<9} {'':>10}  export failed: {type(e).__name__}: {str(e).splitlines()[0]}")
                continue
            for opset in (None, 23):
                print(row(name, path, str(Path(folder) / f"out_{opset}_{name}.onnx"), opset, options), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
