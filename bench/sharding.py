"""Predicted and measured time of sharded programs, on 1 and 2 processes side by side.

For each model, ``egraph_opt.shard`` chooses a sharding over 2 devices (compute priced from the
latency database, timing the shapes one device sees where it has none; communication by the link
``egraph-opt profile --collectives`` fitted). A device is one core: every process, and the
latency database's timings, run one thread (this machine's 2 cores are shared with other jobs,
where a 2-thread process stalls at each barrier). Measured: the median of ``--repeats`` runs of
the unsharded program on 1 process and of the sharded one on 2 gloo processes, each step timed
on every device, the slowest counted; the two are measured in turns, ``--rounds`` times, and the
quickest round of each is printed.

    python bench/sharding.py [--rounds 2] [--repeats 10] [--quick]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import egraph_opt  # noqa: E402
from egraph_opt.profiling.profile_db import default_path  # noqa: E402
from egraph_opt.sharding.cost import measured_links  # noqa: E402
from test_sharding import Block  # noqa: E402


def mlp(d: int, h: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, d))


def models(quick: bool):
    scale = 4 if quick else 1
    yield "MLP large batch", mlp(256, 256), torch.randn(8192 // scale, 256)
    yield "MLP large weights", mlp(2048 // scale, 4096 // scale), torch.randn(16, 2048 // scale)
    c = 256 // scale
    yield "transformer block", Block(c, 4).eval(), torch.randn(8, 128 // scale, c)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="smaller models")
    parser.add_argument("--db", default=str(default_path().with_name("sharding-bench.sqlite")),
                        help="latency database (its own by default: timings of one thread)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    links = measured_links()
    print("link: " + ", ".join(f"{k} {v.alpha_s * 1e6:.0f} us + {v.beta_s * 1e9:.2f} ns/B"
                               for k, v in links.items()))
    header = (f"{'model':<18} {'chosen (2 devices)':<28} {'pred 1p ms':>10} {'meas 1p ms':>10} "
              f"{'pred 2p ms':>10} {'meas 2p ms':>10} {'plan s':>7}")
    print(header, flush=True)
    for name, model, x in models(args.quick):
        start = time.perf_counter()
        with torch.no_grad():
            plan = egraph_opt.shard(model, x, mesh=2, links=links, profile_db=args.db,
                                    profile_budget=60)
            planned = time.perf_counter() - start
            one, two = [], []
            for _ in range(args.rounds):
                one.append(plan.measure(x, repeats=args.repeats, sharded=False, threads=1))
                two.append(plan.measure(x, repeats=args.repeats, threads=1))
            torch.testing.assert_close(plan.run(x), model(x), rtol=1e-4, atol=1e-4)
        chosen = ", ".join(f"{n} {op}" for op, n in sorted(plan.collectives().items())) or "unsharded"
        print(f"{name:<18} {chosen:<28} {plan.unsharded_s * 1e3:>10.2f} {min(one) * 1e3:>10.2f} "
              f"{plan.predicted_s * 1e3:>10.2f} {min(two) * 1e3:>10.2f} {planned:>7.1f}", flush=True)
    print("(pred: the cost model's time on one device; meas: median of runs, quickest round; "
          "2p: 2 gloo processes; results equal the original's)")


if __name__ == "__main__":
    main()
