"""Batch ONNX on Dask: throughput of ``egraph-opt onnx --cluster`` with 1 and 2 workers, side by side.

Generates a folder of small models (random weights: a matmul, a naive softmax, log-softmax or
layer norm written out op by op, another matmul), starts one LocalCluster per worker count
(workers warmed by importing egraph-opt, so start-up is not counted), and optimizes the folder
with each, rounds interleaved. Prints models per second and the speedup of 2 workers over 1.

    .venv/bin/python bench/onnx_batch_scale.py [--models 24] [--rounds 2]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from egraph_opt.drivers import cli


def _middle(kind: str, h: str) -> list:
    """Nodes from ``h`` to ``m``: a stable form written out the naive way, for the optimizer."""
    if kind == "softmax":
        return [helper.make_node("ReduceMax", [h], ["mx"], axes=[-1], keepdims=1),
                helper.make_node("Sub", [h, "mx"], ["d"]), helper.make_node("Exp", ["d"], ["e"]),
                helper.make_node("ReduceSum", ["e", "axes"], ["s"], keepdims=1),
                helper.make_node("Div", ["e", "s"], ["m"])]
    if kind == "log_softmax":
        return [helper.make_node("Exp", [h], ["e"]),
                helper.make_node("ReduceSum", ["e", "axes"], ["s"], keepdims=1),
                helper.make_node("Div", ["e", "s"], ["p"]), helper.make_node("Log", ["p"], ["m"])]
    return [helper.make_node("ReduceMean", [h], ["mu"], axes=[-1], keepdims=1),  # layer norm
            helper.make_node("Sub", [h, "mu"], ["c"]), helper.make_node("Mul", ["c", "c"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], keepdims=1),
            helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
            helper.make_node("Div", ["c", "sd"], ["m"])]


def model(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    kind = ("softmax", "log_softmax", "layer_norm")[seed % 3]
    batch, d_in, width, d_out = 4, int(rng.choice([16, 32])), int(rng.choice([32, 64])), 8
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
               for name, shape in (("w1", (d_in, width)), ("b1", (width,)), ("w2", (width, d_out)))]
    weights.append(numpy_helper.from_array(np.array(1e-5, np.float32), "eps") if kind == "layer_norm"
                   else numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["xw"]), helper.make_node("Add", ["xw", "b1"], ["h"]),
             *_middle(kind, "h"), helper.make_node("MatMul", ["m", "w2"], ["y"])]
    graph = helper.make_graph(nodes, f"{kind}_{seed}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, d_in])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, d_out])],
                              weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _warm() -> str:
    """Import what a model needs (torch, egglog, onnxruntime) once per worker, before timing."""
    import egraph_opt.drivers.onnx_batch as batch
    return batch.__name__


def _batch(folder: str, out: str, address: str) -> float:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["onnx", folder, "--out", out, "--cluster", address, "--latency-runs", "0"])
    seconds = time.perf_counter() - start
    if rc != 0:
        raise SystemExit(f"batch on {address} failed (exit {rc})")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    root = tempfile.mkdtemp(prefix="egraph-opt-scale-")
    folder = os.path.join(root, "models")  # outputs beside it: a folder's batch takes subfolders too
    os.mkdir(folder)
    for seed in range(args.models):
        onnx.save(model(seed), os.path.join(folder, f"model_{seed:02d}.onnx"))
    print(f"{args.models} generated models in {folder}; {os.cpu_count()} CPUs")
    with contextlib.ExitStack() as stack:
        clients = {}
        for workers in (1, 2):
            cluster = stack.enter_context(LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                silence_logs=logging.ERROR))
            clients[workers] = stack.enter_context(Client(cluster))
            clients[workers].run(_warm)
        seconds: dict[int, list[float]] = {1: [], 2: []}
        for r in range(args.rounds):  # interleaved: both see the same machine load
            for workers, client in clients.items():
                out = os.path.join(root, f"out_{workers}_{r}")
                seconds[workers].append(_batch(folder, out, client.scheduler.address))
    one, two = (statistics.median(seconds[w]) for w in (1, 2))
    print(f"{'workers':>8}  {'seconds (median)':>16}  {'models/s':>9}  rounds")
    for workers, t in ((1, one), (2, two)):
        print(f"{workers:>8}  {t:>16.2f}  {args.models / t:>9.2f}  "
              f"{', '.join(f'{s:.2f}' for s in seconds[workers])}")
    print(f"speedup of 2 workers over 1: {one / two:.2f}x")


if __name__ == "__main__":
    main()
