"""Command line: ``egraph-opt rules`` (the rule catalogue), ``egraph-opt onnx`` (batch ONNX)."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="egraph-opt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rules = sub.add_parser("rules", help="list the rewrite rule catalogue")
    rules.add_argument("--family", choices=[f.value for f in Family])
    rules.set_defaults(run=_rules)
    add_onnx_command(sub)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
