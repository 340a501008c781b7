"""ONNX zoo: onnxruntime latency of each zoo model, original vs optimized by egraph-opt.

ORT's own graph optimizations are on (ORT_ENABLE_ALL, its default) for both, one thread each,
runs interleaved in one process, medians of the wall clock and of the thread's CPU time (on a
machine shared with other work the CPU time is the steadier of the two). The ratio is optimized /
original latency: below 1.0 is faster.
Two passes: the models as exported (opset 17, where attention has no operator and onnxruntime's
own fusions already catch most of what ours find), and with ``--opset 23`` (converted first, so
that attention becomes one Attention over the unsplit heads). The original is the same exported
model in both.
Then GPT-2, BERT and a single-head attention at ``--width`` and ``--length``, exported both ways:
by TorchScript (opset 17; optimized as exported and with ``--opset 23``) and by the dynamo exporter
(``torch.onnx.export(dynamo=True)``, opset 20, softmax guarded by IsNaN/Where; ``--opset 23``).
Last, why residual adds are written as Sum: onnxruntime's SkipLayerNormalization (its fusion of
Add + LayerNormalization) against Sum + LayerNormalization, which it leaves unfused.
Run: ``.venv/bin/python bench/onnx_zoo.py [--runs N] [--width C --length T --layers L] [--dynamo-only]
[--profile-budget S]`` (0: priced by static estimates, the same choice on every machine).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))  # bench/ and tests/, never the root (its kernels/ hides
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]  # Hugging Face's, which transformers imports)

import onnx  # noqa: E402

from egraph_opt.drivers.onnx_batch import latencies, process, random_feeds, session  # noqa: E402
from egraph_opt.profiling.latency import default_budget  # noqa: E402
from test_onnx import build_dynamo_zoo, build_zoo  # noqa: E402

HEADER = (f"{'model':<12} {'nodes':>11} {'wall ms original':>17} {'optimized':>10} {'ratio':>6} "
          f"{'CPU ms original':>16} {'optimized':>10} {'ratio':>6}  rewrites")


def driver_options(folder: str, runs: int, budget: float) -> dict:
    """The batch driver's options for a benchmark: profiled into a database of this run's own
    (not the user's cache), ``runs`` interleaved timed runs per model."""
    return {"force": True, "objective": "balanced", "seed": 0, "latency_runs": runs,
            "profile_db": str(Path(folder) / "profile.sqlite"), "profile_budget": budget}


def report(name: str, path: str, target: str, options: dict) -> None:
    """Optimize one model and print its line: the batch's latencies (wall clock), then the
    thread's CPU time over as many more runs, both interleaved, median."""
    r = process(path, target, options)
    if r["status"] != "optimized":
        print(f"{name:<12} failed: {r['reason']}")
        return
    if "kept_original" in r:
        print(f"{name:<12} kept as it was: {r['kept_original']}")
        return
    before, after = r["latency_ms_before"], r["latency_ms_after"]
    feeds = random_feeds(onnx.load(path), options["seed"])
    cpu_before, cpu_after = latencies([session(path), session(target)], feeds, options["latency_runs"],
                                      clock=time.thread_time)
    nodes = f"{r['nodes_before']} -> {r['nodes_after']}"
    rewrites = ", ".join(f"{k} x{n}" for k, n in sorted(r["rewrites"].items()))
    print(f"{name:<12} {nodes:>11} {before:>17.4f} {after:>10.4f} {after / before:>6.2f} "
          f"{cpu_before:>16.4f} {cpu_after:>10.4f} {cpu_after / cpu_before:>6.2f}  {rewrites}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="timed runs per model and variant")
    parser.add_argument("--width", type=int, default=256, help="dynamo exports: hidden size C")
    parser.add_argument("--length", type=int, default=128, help="dynamo exports: sequence length T")
    parser.add_argument("--layers", type=int, default=2, help="dynamo exports: transformer blocks")
    parser.add_argument("--dynamo-only", action="store_true", help="only the dynamo exports")
    parser.add_argument("--profile-budget", type=float, default=default_budget(),
                        help="seconds per model of kernel profiling, as the CLI's (0: static estimates)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        options = driver_options(folder, args.runs, args.profile_budget)
        out = Path(folder) / "out"
        out.mkdir()
        if not args.dynamo_only:
            (Path(folder) / "zoo").mkdir()
            zoo = build_zoo(Path(folder) / "zoo")
            for opset in (None, 23):
                print(f"\n{'as exported (opset 17)' if opset is None else f'--opset {opset}'}\n{HEADER}")
                for name, path in zoo.items():
                    report(name, path, str(out / f"{name}.onnx"), {**options, "opset": opset})
        sizes = f"C={args.width} T={args.length} {args.layers} layers"
        passes = [] if args.dynamo_only else [(False, None), (False, 23)]
        for dynamo, opset in passes + [(True, 23)]:
            zoo = build_dynamo_zoo(Path(folder), args.width, args.length, args.layers, dynamo)
            kind = "dynamo exports (opset 20)" if dynamo else "TorchScript exports (opset 17)"
            print(f"\n{kind}, {sizes}, {'as exported' if opset is None else f'--opset {opset}'}\n{HEADER}")
            for name, path in zoo.items():
                report(name, path, str(out / os.path.basename(path)), {**options, "opset": opset})
        skip_layer_norm(args.width, args.length, args.runs)
    return 0


def skip_layer_norm(width: int, length: int, runs: int) -> None:
    """LayerNormalization(x + r) as Add (which onnxruntime fuses into SkipLayerNormalization) and
    as Sum (left as two nodes), thread CPU time, interleaved medians."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    shape = [1, length, width]

    def model(op):
        nodes = [helper.make_node(op, ["x", "r"], ["s"]),
                 helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], epsilon=1e-5)]
        params = [numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), n) for n in "gb"]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
                                               for n in "xr"],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], params)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "xr"}
    fused, two = latencies([session(model("Add")), session(model("Sum"))], feeds, runs, clock=time.thread_time)
    print(f"\nLayerNormalization(x + r) at {length} x {width}, CPU ms: Add (SkipLayerNormalization) "
          f"{fused:.4f}, Sum + LayerNormalization {two:.4f}, ratio {two / fused:.2f}")


if __name__ == "__main__":
    sys.exit(main())
