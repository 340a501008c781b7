"""ONNX zoo: onnxruntime latency of each zoo model, original vs optimized by egraph-opt.

ORT's own graph optimizations are on (ORT_ENABLE_ALL, its default) for both, one thread each,
runs interleaved in one process. The ratio is optimized / original latency: below 1.0 is faster.
Two passes: the models as exported (opset 17, where attention has no operator and onnxruntime's
own fusions already catch most of what ours find), and with ``--opset 23`` (converted first, so
that attention becomes one Attention over the unsplit heads). The original is the same exported
model in both.
Run: ``.venv/bin/python bench/onnx_zoo.py [--runs N]``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from egraph_opt.drivers.onnx_batch import process  # noqa: E402
from tests.test_onnx import build_zoo  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="timed runs per model and variant")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "zoo").mkdir()
        zoo = build_zoo(Path(folder) / "zoo")
        for opset in (None, 23):
            out = Path(folder) / f"out{opset}"
            out.mkdir()
            options = {"force": False, "objective": "balanced", "seed": 0, "latency_runs": args.runs,
                       "opset": opset}
            print(f"\n{'as exported (opset 17)' if opset is None else f'--opset {opset}'}\n"
                  f"{'model':<10} {'nodes':>11} {'ORT ms original':>16} {'optimized':>10} {'ratio':>7}"
                  "  rewrites")
            for name, path in zoo.items():
                r = process(path, str(out / f"{name}.onnx"), options)
                if r["status"] != "optimized":
                    print(f"{name:<10} failed: {r['reason']}")
                    continue
                before, after = r["latency_ms_before"], r["latency_ms_after"]
                nodes = f"{r['nodes_before']} -> {r['nodes_after']}"
                rewrites = ", ".join(f"{k} x{n}" for k, n in sorted(r["rewrites"].items()))
                print(f"{name:<10} {nodes:>11} {before:>16.4f} {after:>10.4f} {after / before:>7.2f}"
                      f"  {rewrites}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
