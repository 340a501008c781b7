"""Command line: ``rules`` (the catalogue), ``kernels`` (the registry), ``profile`` (timings into
the latency database), ``onnx`` (batch-optimize ONNX exports)."""
from __future__ import annotations

import argparse
import sys

from .onnx_batch import add_onnx_command
from .rulesets import Family, catalogue


def _rules(args) -> int:
    rows = [r for r in catalogue().values() if args.family is None or r.family.value == args.family]
    width = max(len(r.name) for r in rows)
    for r in rows:
        when = f"  when {' '.join(r.when)}" if r.when else ""
        print(f"{r.name:<{width}}  {r.family.value:<13} {r.exactness.value:<8} {r.describe()}{when}")
    print(f"{len(rows)} rules")
    return 0


def _kernels(args) -> int:
    from .kernels.registry import REGISTRY

    rows = [k for k in REGISTRY.values() if args.backend is None or k.backend == args.backend]
    width = max(len(k.name) for k in rows)
    for k in rows:
        print(f"{k.name:<{width}}  {k.backend:<7} {','.join(sorted(k.devices)):<9} "
              f"{','.join(sorted(k.dtypes)) if len(k.dtypes) < 5 else 'any':<32} {k.reference}")
    print(f"{len(rows)} kernels")
    return 0


def _profile(args) -> int:
    import torch

    from .profile_db import ProfileDB
    from .profiler import SPECS, profile_ops

    torch.set_num_threads(args.threads)
    unknown = set(args.ops or ()) - set(SPECS)
    if unknown:
        print(f"egraph-opt profile: no shape grid for {sorted(unknown)}; known: {sorted(SPECS)}",
              file=sys.stderr)
        return 2
    with ProfileDB(args.db) as db:
        records = profile_ops(args.ops or sorted(SPECS), args.dtype, args.device, db, args.sizes,
                              args.repeats)
        print(f"{len(records)} timings recorded in {db.path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="egraph-opt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rules = sub.add_parser("rules", help="list the rewrite rule catalogue")
    rules.add_argument("--family", choices=[f.value for f in Family])
    rules.set_defaults(run=_rules)
    kernels = sub.add_parser("kernels", help="list the kernel registry")
    kernels.add_argument("--backend", choices=["torch", "numpy", "triton"])
    kernels.set_defaults(run=_kernels)
    profile = sub.add_parser("profile", help="time kernels over a shape grid into the database")
    profile.add_argument("--ops", type=lambda s: s.split(","), help="comma-separated ops")
    profile.add_argument("--dtype", nargs="+", default=["float32"])
    profile.add_argument("--device", default="cpu")
    profile.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")],
                         default=[16, 64, 256, 1024])
    profile.add_argument("--repeats", type=int, default=15)
    profile.add_argument("--threads", type=int, default=1)
    profile.add_argument("--db", help="database file (default: $EGRAPH_OPT_PROFILE_DB or the "
                         "user cache)")
    profile.set_defaults(run=_profile)
    add_onnx_command(sub)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
