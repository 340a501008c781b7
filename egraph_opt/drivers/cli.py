"""Command line: ``rules`` (the catalogue), ``kernels`` (the registry), ``profile`` (timings into the latency database),
``onnx`` (batch-optimize ONNX exports). Every error is one line on stderr (exit status 2: a bad argument, 1: a
failure, 130: Ctrl-C); ``--debug`` shows the traceback."""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

from ..profiling.profile_db import ProfileDB, ProfileDBError
from ..profiling.profiler import MOVE, SPECS, Case, grid, machine_busy, profile_ops, profile_shapes, timeable
from ..rulesets import Family, catalogue
from .pictures import Table
from .usage import Failure, MissingExtra, ModelFailure, argument, at_least, html, require

_SELF_EXPLAINING = (Failure, ProfileDBError, OSError, MissingExtra)  # their message needs no exception name


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """One line, not the usage block: the usage is one --help away."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def _rules(args) -> int:
    rows = [[r.name, r.family.value, r.exactness.value, r.describe() + (f"  when {r.when}" if r.when else "")]
            for r in catalogue().values() if args.family is None or r.family.value == args.family]
    print(Table("the rule catalogue", ["rule", "family", "exactness", "rewrite"], rows, note=f"{len(rows)} rules"))
    return 0


def _kernels(args) -> int:
    from ..kernels.registry import MOVES, REGISTRY
    rows = [[k.name, k.backend, ",".join(sorted(k.devices)), ",".join(sorted(k.dtypes)) if len(k.dtypes) < 5
             else "any", k.reference] for k in [*REGISTRY.values(), *MOVES.values()]
            if args.backend is None or args.backend in k.backend.split("->")]
    print(Table("the kernel registry", ["kernel", "backend", "devices", "dtypes", "reference"], rows,
                note=f"{len(rows)} kernels"))
    return 0


def _profile(args) -> int:
    if args.collectives:
        return _profile_collectives(args)
    from ..kernels.torch_ops import TORCH
    torch.set_num_threads(args.threads)
    if unknown := set(args.ops or ()) - set(SPECS):
        print(f"egraph-opt profile: no shape grid for {sorted(unknown)}; known: {sorted(SPECS)}", file=sys.stderr)
        return 2
    with ProfileDB(args.db) as db:
        if args.export_to:
            from .staging import claim  # loads onnx: only here
            target, exported = os.path.expanduser(args.export_to), []
            base = os.path.basename(target)
            try:  # written aside and linked in: never over a file, never half-written
                claim(lambda folder: exported.append(db.export(os.path.join(folder, base))), target, [base])
            except ModelFailure:
                raise Failure(f"{target} exists: export writes a new file") from None
            print(f"{exported[0]} timings exported from {db.path} to {target}")
            return 0
        if args.import_from:
            added, skipped = db.import_file(args.import_from)
            print(f"{added} timings imported into {db.path} ({skipped} already there); rows keep the "
                  "machine they were measured on and count as measurements only there")
            return 0
        if busy := machine_busy():  # asked for: timed all the same, with a word on what the rows will hold
            print(f"egraph-opt profile: warning: {busy}; the timings recorded now may be other "
                  "processes' interference, not this machine's speed", file=sys.stderr)
        if args.program:
            cases = program_cases(args.program, args.shapes, args.dtype[0])
            records = profile_shapes(cases, args.device, db, repeats=args.repeats, kernels=TORCH)
        else:
            ops = args.ops or sorted(SPECS)
            records = profile_ops(ops, args.dtype, args.device, db, args.sizes, args.repeats, kernels=TORCH)
            records += _profile_other_backends(ops, args, db)
        print(f"{len(records)} timings recorded in {db.path}")
    return 0


def _profile_other_backends(ops: list[str], args, db) -> list:
    """The grid for each other usable kernel of ``ops`` (its own rows), and moves into its backend."""
    from ..kernels.binding import usable
    from ..kernels.registry import MOVES, copies, kernels_for
    records, backends = [], set()
    for kernel in (k for op in ops for k in kernels_for(op)
                   if k.db_backend != "torch" and usable(k, args.device) and args.device in k.devices):
        cases = [c for c in grid([kernel.op], args.dtype, args.sizes) if c.dtype in kernel.dtypes]
        records += profile_shapes(cases, args.device, db, repeats=args.repeats, kernel=kernel)
        backends.add(kernel.backend)  # its memory: the moves into it and out
    for (source, target), move in MOVES.items():
        if {source, target} <= backends | {"torch"} and copies(source, target):  # both usable here
            cases = [Case(op=MOVE, dtype=dtype, shapes=((n, n),), attrs={}) for dtype in args.dtype
                     for n in args.sizes if dtype in move.dtypes]
            records += profile_shapes(cases, args.device, db, repeats=args.repeats, kernel=move)
    return records


def _profile_collectives(args) -> int:
    """Time gloo's collectives over 2 processes; keep their alpha-beta fit beside the latency database."""
    from ..sharding.cost import fit_links, save_links
    from ..sharding.run import profile_collectives
    timings = profile_collectives(2, repeats=args.repeats)
    for name, nbytes, seconds in timings:
        print(f"{name:<15} {nbytes:>9} bytes  {seconds * 1e6:9.1f} us")
    links = fit_links(timings)
    for name, link in links.items():
        print(f"{name:<15} alpha {link.alpha_s * 1e6:.1f} us  beta {link.beta_s * 1e9:.3f} ns/byte "
              f"({1 / link.beta_s / 1e9 if link.beta_s else float('inf'):.2f} GB/s)")
    print(f"links recorded in {save_links(links, args.db)}")
    return 0


def program_cases(spec: str, shapes: list[tuple[int, ...]], dtype: str) -> list:
    """Every kernel call the saturated e-graph of ``module:function`` could make, at its shapes:
    one profiling case per distinct (op, operand shapes, attributes) the profiler can time."""
    import importlib
    from ..egraph.session import reopened
    from ..frontends.capture import capture
    from ..lang.ops import OPS
    from ..lang.term import SCALAR
    from ..optimization.pipeline import class_meta, optimize
    module_name, _, name = spec.partition(":")
    if os.getcwd() not in sys.path:  # a module of the folder the command runs in, as ``python -m`` finds it
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise Failure(f"cannot load {spec!r} ({e}); use module:function") from None
    fn = getattr(fn, "fn", fn)  # a decorated function: profile the original
    program, _ = capture(fn, tuple(torch.randn(s, dtype=getattr(torch, dtype)) for s in shapes))
    session = reopened(optimize(program, templates=False).egraph, program.roots())  # every kernel it could use
    of_class, cases = class_meta(session.snap.classes, {c: program.meta()[i] for i, c in session.class_of.items()}), {}
    for n in (n for nodes in session.snap.classes.values() for n in nodes):
        if n.op in SPECS and all(c in of_class for c in n.children):
            operands = tuple(of_class[c][0] for c in n.children if of_class[c] != SCALAR)
            if not timeable(n.op, operands):  # an operand is a constant: the call is not the one timed
                continue
            attrs = {k: v for (k, _), v in zip(OPS[n.op].attrs, n.attrs)}
            cases[n.op, operands, n.attrs] = Case(op=n.op, dtype=dtype, shapes=operands, attrs=attrs)
    return list(cases.values())


def _ints(parse, text: str, sep: str) -> list[int]:
    try:
        return [parse(item) for item in text.split(sep) if item]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


_dtype = argument(lambda text: text if isinstance(getattr(torch, text, None), torch.dtype) else None,
                  " is not a torch dtype such as float32")
_device = argument(lambda text: text if torch.device(text) else None, " is not a torch device such as cpu or cuda:0")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="egraph-opt", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"egraph-opt {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    rules = sub.add_parser("rules", help="list the rewrite rule catalogue")
    rules.add_argument("--family", choices=[f.value for f in Family])
    rules.set_defaults(run=_rules)
    kernels = sub.add_parser("kernels", help="list the kernel registry")
    kernels.add_argument("--backend", choices=["torch", "numpy", "triton"])
    kernels.set_defaults(run=_kernels)
    profile = sub.add_parser("profile", help="time kernels over a shape grid into the database")
    profile.add_argument("--ops", type=lambda s: s.split(","), help="comma-separated ops")
    profile.add_argument("--dtype", nargs="+", type=_dtype, default=["float32"])
    profile.add_argument("--device", type=_device, default="cpu")
    profile.add_argument("--sizes", type=lambda s: _ints(at_least(1), s, ","), default=[16, 64, 256, 1024])
    profile.add_argument("--repeats", type=at_least(1), default=15)
    profile.add_argument("--threads", type=at_least(1), default=1)
    profile.add_argument("--db", help="database file (default: $EGRAPH_OPT_PROFILE_DB or the user cache)")
    profile.add_argument("--for", dest="program", metavar="MODULE:FUNCTION",
                         help="profile every kernel this program's e-graph could use, at its shapes")
    profile.add_argument("--collectives", action="store_true", help="time gloo's all-gather, all-reduce "
                         "and reduce-scatter over 2 processes: the sharding cost's link model")
    profile.add_argument("--shapes", default=[], help="example input shapes for --for, e.g. 2x8x16,2x8x16",
                         type=lambda s: [tuple(_ints(at_least(1), item, "x")) for item in s.split(",") if item])
    moves = profile.add_mutually_exclusive_group()
    moves.add_argument("--export", dest="export_to", metavar="FILE",
                       help="write every timing of the database to a new file, to move it")
    moves.add_argument("--import", dest="import_from", metavar="FILE",
                       help="add the timings of another machine's export to the database")
    profile.set_defaults(run=_profile)
    try:
        from .onnx_batch import add_onnx_command
        add_onnx_command(sub)
    except ModuleNotFoundError:  # no onnx extra: every other command works, and this one says so
        onnx = sub.add_parser("onnx", help="batch-optimize ONNX models (needs egraph-opt[onnx])", add_help=False)
        onnx.add_argument("rest", nargs=argparse.REMAINDER)
        onnx.set_defaults(run=lambda args: require("onnx", "egraph-opt onnx"))
    for command in sub.choices.values():  # also after the command; SUPPRESS keeps a --debug before
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "profile" and args.program and not args.shapes:
        profile.error("--for needs --shapes, the example input shapes")
    return _run(args, f"egraph-opt {args.command}")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("egraph-opt")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "(not installed)"


def _run(args: argparse.Namespace, prog: str) -> int:
    """Run the command; an error, and each warning (a profile database set aside), is one line."""
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *_: print(f"{prog}: warning: {message}", file=sys.stderr)
        try:  # each extra the arguments ask for is checked before any work
            if args.command == "onnx" and getattr(args, "report", None) and html(args.report):
                require("report", f"--report {args.report}")
            if args.command == "onnx" and getattr(args, "cluster", None):
                require("cluster", "--cluster")
            status = args.run(args)
            sys.stdout.flush()  # a reader that left (``| head``) shows here, not at exit
            return status
        except BrokenPipeError:  # the reader has what it wanted: end quietly, as ``head`` expects
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
            return 0
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130
        except Exception as e:  # noqa: BLE001 - one line, the traceback only on request
            if args.debug:
                raise
            message = str(e).splitlines()[0] if str(e) else ""
            kind = "" if isinstance(e, _SELF_EXPLAINING) else f"{type(e).__name__}: "
            print(f"{prog}: {kind}{message}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
