"""How well does the latency model predict shapes it has not measured? (this machine, CPU)

Profiles a grid of sizes for several ops, holds out every third interior size, fits on the rest
and prints, per kernel, the relative error |predicted - measured| / measured on the held-out
shapes (median and 90th percentile; goal: median <= 20%) beside the model's own uncertainty.

    .venv/bin/python bench/latency_model.py [--repeats 15] [--threads 1] [--db PATH]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from egraph_opt.profiling.latency import LatencyModel
from egraph_opt.profiling.profile_db import ProfileDB
from egraph_opt.kernels.torch_ops import TORCH
from egraph_opt.profiling.profiler import profile_ops

OPS = ["add", "mul", "exp", "gelu", "sum", "logsumexp", "softmax", "log_softmax", "layer_norm",
       "matmul", "linear", "sdpa"]
SIZES = sorted({int(round(n)) for n in np.geomspace(8, 1536, 20)})
HELD_OUT = set(SIZES[1:-1:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a shared 2-core machine, "
                             "waking a second thread costs milliseconds of noise)")
    parser.add_argument("--db", type=Path, help="keep the measurements here (default: a temp file)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="latency-bench-"))
    start = time.perf_counter()
    with ProfileDB(args.db or tmp / "all.sqlite") as db:
        records = profile_ops(OPS, ["float32"], "cpu", db, SIZES, repeats=args.repeats, kernels=TORCH)
    profiled_s = time.perf_counter() - start
    held = [r for r in records if r.shapes[0][-2] in HELD_OUT]
    with ProfileDB(tmp / "train.sqlite") as train:
        train.add_many(r for r in records if r.shapes[0][-2] not in HELD_OUT)
        model = LatencyModel(train)
        print(f"{records[0].device}; sizes {SIZES}, "
              f"held out {sorted(HELD_OUT)}; profiled {len(records)} shapes in {profiled_s:.0f} s\n")
        print(f"{'kernel':<12} {'train':>5} {'test':>4} {'median err':>10} {'p90 err':>8} "
              f"{'model uncertainty':>17}")
        medians = []
        for op in OPS:
            estimates = [(r, model.predict(r.kernel, r.backend, r.device, r.dtype, r.shapes, r.attrs))
                         for r in held if r.kernel == op]
            errors = [abs(e.seconds - r.median_s) / r.median_s for r, e in estimates]
            assert all(e.source == "interpolated" for _, e in estimates)
            medians.append(np.median(errors))
            print(f"{op:<12} {len(SIZES) - len(HELD_OUT):>5} {len(errors):>4} {medians[-1]:>10.1%} "
                  f"{np.percentile(errors, 90):>8.1%} {estimates[0][1].uncertainty:>17.1%}")
        print(f"\nmedian of the per-kernel medians: {np.median(medians):.1%} (goal <= 20%)")


if __name__ == "__main__":
    main()
