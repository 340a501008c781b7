"""``egraph-opt onnx IN... --out DIR``: optimize ONNX models in batch, each validated before written.

A model is written (atomically) only once onnx.checker and onnxruntime on random inputs pass, and as it was where
onnxruntime runs it slower for no stability (``api.slower_for_nothing``); a failing one is reported with its reason
while the others go on, and sets the exit status."""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Callable

import numpy as np
import onnx
from tqdm import tqdm

from .api import slower_for_nothing
from .staging import earlier_output, made_from, remove_staging, stamp, write_atomic
from .usage import Failure, ModelFailure, argument, at_least, html, new_file_mode
from ..extractors import CostModel, Objective
from ..profiling.latency import MeasuredLatency, budget_seconds, default_budget
from ..profiling.profile_db import UNUSABLE, ForeignFileError, ProfileDB, default_path
from ..backends.onnx_backend import OnnxExportError, export
from ..frontends.onnx_converters import opset_of
from ..frontends.onnx_frontend import OnnxImportError, _value_type, import_model, load
from ..optimization.pipeline import optimize
from ..validate import imported_reference, judge

_PASS_THROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"}
_SYMBOLIC_DIM = 3  # size given to symbolic dims of random inputs
_EXTERNAL_ABOVE = 1 << 30  # bytes: larger models are written with their tensors beside them


def vocabularies(model: onnx.ModelProto) -> dict[str, int]:
    """Exclusive bound of each integer input indexing (through casts, reshapes) a Gather's constant table."""
    tables = {t.name: list(t.dims) for t in model.graph.initializer}
    users: dict[str, list[onnx.NodeProto]] = {}
    for name, node in ((name, node) for node in model.graph.node for name in node.input):
        users.setdefault(name, []).append(node)
    bounds = {}
    for inp in model.graph.input:
        frontier, seen = [inp.name], set()
        while frontier:
            name = frontier.pop()
            seen.add(name)
            for node in users.get(name, []):
                if node.op_type == "Gather" and node.input[1] == name and node.input[0] in tables:
                    size = tables[node.input[0]][next((a.i for a in node.attribute if a.name == "axis"), 0)]
                    bounds[inp.name] = min(bounds.get(inp.name, size), size)
                elif node.op_type in _PASS_THROUGH and node.input[0] == name:
                    frontier += [o for o in node.output if o not in seen]
    return bounds


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs respecting dtypes: floats normal, ids within vocabularies, other ints 0/1."""
    rng, initializers = np.random.default_rng(seed), {t.name for t in model.graph.initializer}
    vocab, feeds = vocabularies(model), {}
    for info in [i for i in model.graph.input if i.name not in initializers]:
        if (vt := _value_type(info)) is None or vt.shape is None:
            raise ModelFailure(f"input {info.name!r} has no tensor shape to draw inputs for")
        shape = [d if isinstance(d, int) else _SYMBOLIC_DIM for d in vt.shape]
        np_type = onnx.helper.tensor_dtype_to_np_dtype(vt.elem_type)
        feeds[info.name] = rng.standard_normal(shape).astype(np_type) if np_type.kind == "f" else \
            rng.random(shape) < 0.5 if np_type.kind == "b" else \
            rng.integers(0, vocab.get(info.name, 2), shape).astype(np_type)
    return feeds


def session(model: onnx.ModelProto | str):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def latencies(sessions: list, feeds: dict, runs: int, stopped: Callable[[], bool] | None = None,
              clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Median milliseconds per session, runs interleaved so both see the same machine; ``time.thread_time``
    as ``clock``: the CPU time of a session's one thread, which other work on the machine inflates less."""
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(runs):
        if stopped is not None and stopped():
            raise ModelFailure("interrupted")
        for s, bucket in zip(sessions, times):
            start = clock()
            s.run(None, feeds)
            bucket.append((clock() - start) * 1e3)
    return [statistics.median(t) for t in times]


def upgraded(model: onnx.ModelProto, opset: int | None) -> onnx.ModelProto:
    """The model at ``opset`` where newer than its own (fused operators: Gelu from 20, Attention from 23)."""
    if opset is None or opset <= opset_of(model):
        return model
    from onnx import version_converter
    try:
        return version_converter.convert_version(model, opset)
    except Exception as e:  # noqa: BLE001 - the converter raises several types
        raise ModelFailure(f"cannot convert opset {opset_of(model)} to {opset}: "
                           f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def process(path: str, target: str, options: dict, stopped: Callable[[], bool] | None = None) -> dict:
    """One model optimized: its report record (status, reason, numbers). The same work in-process, in a -j
    worker and on a cluster; ``stopped`` (a cluster's), asked between steps, ends it unwritten."""
    record, start = {"model": path, "output": target, "status": "failed", "reason": ""}, time.perf_counter()
    latency = None
    try:
        earlier = None if options["force"] or options.get("same_is_ours") else earlier_output(path, target, options)
        if earlier is not None:  # kept (an earlier run's), or a file in the way
            return {**record, **earlier, "seconds": round(time.perf_counter() - start, 3)}
        original, stored = load(path), onnx.load(path, load_external_data=False)  # stored: where its tensors are kept
        src = import_model(upgraded(original, options.get("opset")), path)
        latency = MeasuredLatency.from_database(  # misses timed into it while the model's budget lasts
            options["profile_db"], budget_s=options.get("profile_budget", 0.0))
        result, optimized = _optimize(src, original, options, latency, record)
        sessions, feeds = _validate(path, src, original, optimized, options["seed"], record)
        if options["latency_runs"]:
            before, after = latencies(sessions, feeds, options["latency_runs"], stopped)
            record["latency_ms_before"], record["latency_ms_after"] = before, after
            slower = f"onnxruntime ran the optimized model {after / before:.2f}x as long ({after:.3f} ms against {before:.3f})"
            if slower_for_nothing(Objective(options["objective"]), result, before, after, slower_by=1.0):
                optimized = original
                record.update(kept_original=slower, latency_ms_after=before, latency_ms_optimized=after,
                              nodes_after=record["nodes_before"])
            elif after > before:  # slower, and written: say so, and why
                record["slower"] = f"{slower}; kept for the stability the {options['objective']} objective asks for"
        external = optimized.ByteSize() > _EXTERNAL_ABOVE or any(
            t.data_location == onnx.TensorProto.EXTERNAL for t in stored.graph.initializer)
        if stopped is not None and stopped():
            raise ModelFailure("interrupted")
        stamp(optimized, made_from(path, options))
        write_atomic(optimized, target, external, options["force"], options.get("run", ""),
                     options.get("same_is_ours", False))
        record.update(status="optimized")
    except (ModelFailure, OnnxImportError, OnnxExportError, OSError) as e:
        record["reason"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    except Exception as e:  # noqa: BLE001 - a bug on one model must not stop the batch
        record["reason"] = f"internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        if latency is not None and latency.db is not None:
            latency.db.close()
    record["seconds"] = round(time.perf_counter() - start, 3)
    return record


def _optimize(src, original: onnx.ModelProto, options: dict, latency, record: dict):
    """The optimizer's result and its export; what it did goes into ``record``."""
    try:
        result = optimize(src.program, model=CostModel(Objective(options["objective"]), latency))
    except Exception as e:  # noqa: BLE001 - any optimizer failure fails this model only
        raise ModelFailure(f"optimizer: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    optimized = export(src, result.program)
    record.update(nodes_before=len(original.graph.node), nodes_after=len(optimized.graph.node),
                  rewrites={r.name: n for r, n in result.applied},
                  derivation=[str(step) for step in result.derivation.steps], ops_before=result.ops_before,
                  ops_after=result.ops_after, curvature_before=result.cost_before.get("curvature"),
                  curvature_after=result.cost_after.get("curvature"), folded=src.folded, opaque=len(src.program.opaque))
    if latency is not None:  # what the cost saw: kernels timed now, and why timing stopped early
        record["kernels_profiled"] = latency.profiled
        if latency.busy:
            record["profiling_stopped"] = latency.busy
    if options.get("pictures"):  # an HTML report draws them: made here, where the e-graph is
        from .explore import model_pictures
        record["pictures"] = model_pictures(result)
    return result, optimized


def _validate(path: str, src, original: onnx.ModelProto, optimized: onnx.ModelProto, seed: int,
              record: dict) -> tuple[list, dict]:
    """onnx.checker, then both models on onnxruntime, judged by the decorator's rule; the sessions, inputs."""
    try:
        onnx.checker.check_model(optimized, full_check=True)
    except Exception as e:  # noqa: BLE001 - checker errors come in several types
        raise ModelFailure(f"onnx.checker: {str(e).splitlines()[0]}") from None
    feeds = random_feeds(original, seed)
    try:
        sessions = [session(path), session(optimized)]
        expected, got = (s.run(None, feeds) for s in sessions)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise ModelFailure(f"onnxruntime: {str(e).splitlines()[0]}") from None
    verdicts = [judge(b, a) for a, b in zip(expected, got)]
    if not all(ok for ok, *_ in verdicts) and not all(
            np.isfinite(a).all() for a in expected if a.dtype.kind == "f"):  # it overflowed:
        if (refs := imported_reference(src.program, feeds, expected)) is not None:  # float64 judges, where faithful
            verdicts = [judge(b, a, r) for a, b, r in zip(expected, got, refs)]
    record["max_error"] = max((err for _, err, _, _ in verdicts), default=0.0)
    for name, (ok, _, _, why) in zip(src.output_names, verdicts):
        if not ok:
            raise ModelFailure(f"validation: output {name!r}: {why}")
    return sessions, feeds


def line(r: dict) -> str:
    """What a batch says of a model as it finishes."""
    if r["status"] == "kept":
        return f"kept   {r['model']}: {r['reason']}"
    if r["status"] != "optimized":
        return f"FAILED {r['model']}: {r['reason']}"
    lat = f", ORT {r['latency_ms_before']:.3f} -> {r['latency_ms_after']:.3f} ms" if "latency_ms_before" in r else ""
    if "kept_original" in r:
        return f"ok     {r['model']}: kept as it was ({r['kept_original']}){lat}"
    slower = f" ({r['slower']})" if "slower" in r else ""
    return (f"ok     {r['model']}: nodes {r['nodes_before']} -> {r['nodes_after']}, "
            f"{sum(r['rewrites'].values())} rewrites{lat}{slower}")


def status(r: dict) -> str:
    """What became of a model: a model written as it was, measured slower optimized, says so."""
    return "kept original" if "kept_original" in r else r["status"]


def summary(records: list[dict]) -> str:
    rows = [("model", "status", "nodes", "rewrites", "curvature", "ORT ms before", "after", "after/before")]
    for r in records:
        ok, before, after = r["status"] == "optimized", r.get("latency_ms_before"), r.get("latency_ms_after")
        rows.append((os.path.basename(r["model"]), status(r),
                     f"{r['nodes_before']} -> {r['nodes_after']}" if "nodes_before" in r else "-",
                     str(sum(r["rewrites"].values())) if "rewrites" in r else "-",
                     f"{r['curvature_before']} -> {r['curvature_after']}" if "curvature_before" in r else "-",
                     f"{before:.3f}" if ok and before else "-", f"{after:.3f}" if ok and after else "-",
                     f"{after / before:.2f}" if ok and before and after else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    kept = sum(r["status"] == "kept" for r in records)
    failed = sum(r["status"] not in ("optimized", "kept") for r in records)
    stopped = sorted({r["profiling_stopped"] for r in records if r.get("profiling_stopped")})
    notes = [f"kernel timing stopped early on {sum('profiling_stopped' in r for r in records)} "
             f"models ({'; '.join(stopped)}): their costs are estimates"] if stopped else []
    counts = f"{len(records) - failed - kept} optimized, {f'{kept} kept, ' if kept else ''}{failed} failed"
    return "\n".join(["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows] + [counts] + notes)


def write_report(path: str, records: list[dict], interrupted: bool) -> None:
    """JSON, or one HTML page with a section per model for a path ending in .html."""
    with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp", delete=False) as f:
        if html(path):
            from .pictures import batch_page
            f.write(batch_page(records, summary(records), interrupted, status))
        else:
            json.dump({"models": records, "interrupted": interrupted}, f, indent=2)
    os.chmod(f.name, new_file_mode())
    os.replace(f.name, path)


def collect(patterns: list[str], out_dir: str) -> tuple[list[str], list[str]]:
    """Model paths from files, directories (their .onnx files, recursively) and glob patterns, and
    those skipped: found under ``out_dir``, where the .onnx files are outputs (an earlier run's)."""
    found, skipped, out_real = [], [], os.path.realpath(out_dir)
    for pattern in patterns:
        pattern = os.path.join(glob.escape(pattern), "**", "*.onnx") if os.path.isdir(pattern) else pattern
        for m in (sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]):
            (skipped if os.path.realpath(m).startswith(out_real + os.sep) else found).append(m)
    return list(dict.fromkeys(found)), skipped


def _writable_dir(path: str, what: str) -> None:
    """Create the directory and make a file in it now, not after every model is optimized."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except FileExistsError:  # a file, not a directory
        raise Failure(f"{what} {path}: is a file, not a directory") from None
    except OSError as e:
        raise Failure(f"{what} {path}: cannot write there ({e.strerror or e})") from None


def _worker_start(driver: int) -> None:
    """A worker ignores SIGINT (the driver stops them on Ctrl-C) and dies with its driver: one killed (``kill -9``)
    cannot stop them, and they would go on writing outputs nobody reports, then wait on its pipe forever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux") and \
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
        if os.getppid() != driver:  # it died before the call
            os._exit(1)
        return
    threading.Thread(target=_watch, args=(driver,), daemon=True).start()


def _watch(driver: int) -> None:
    """Where no parent-death signal exists: the driver has died once this process is another's."""
    while os.getppid() == driver:
        time.sleep(0.5)
    os._exit(1)


def _dispatch(args: argparse.Namespace, targets: dict[str, str], options: dict, done) -> None:
    """Each model processed: on a cluster, in this process, or in a pool of ``-j`` workers."""
    if args.cluster:
        from .onnx_cluster import on_cluster
        return on_cluster(process, args.cluster, targets, options, done, shared_fs=not args.no_shared_fs)
    if args.jobs <= 1:
        for p, target in targets.items():
            done(process(p, target, options))
        return
    pool = ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn"), initializer=_worker_start,
                               initargs=(os.getpid(),))
    try:
        futures = {pool.submit(process, p, t, options): p for p, t in targets.items()}
        for future in as_completed(futures):
            try:
                done(future.result())
            except Exception as e:  # noqa: BLE001 - a worker that died fails its model only
                done({"model": futures[future], "status": "failed", "reason": f"worker died: {type(e).__name__}: {e}"})
    except KeyboardInterrupt:
        for worker in pool._processes.values():  # Python 3.14: pool.terminate_workers()
            worker.terminate()
        raise
    finally:
        pool.shutdown(cancel_futures=True)


def run(args: argparse.Namespace) -> int:
    started, paths = time.time(), _checked_inputs(args)
    remove_staging(args.out, before=started)  # folders of killed runs: no live process holds them
    records: list[dict] = []
    targets = _targets(paths, args.out, records)
    options = {"force": args.force, "objective": args.objective, "seed": args.seed,
               "latency_runs": args.latency_runs, "opset": args.opset, "profile_db": args.profile_db,
               "pictures": bool(args.report) and html(args.report), "run": uuid.uuid4().hex[:12],
               "profile_budget": default_budget() if args.profile_budget is None else args.profile_budget}
    bar = tqdm(total=len(targets), unit="model", file=sys.stderr, disable=not sys.stderr.isatty())
    finished: set[str] = set()
    def done(record):
        records.append(record)
        finished.add(record["model"])
        bar.write(line(record))
        bar.update()
    interrupted = False
    try:
        _dispatch(args, targets, options, done)
    except KeyboardInterrupt:
        interrupted = True
        records += [{"model": p, "output": t, "status": "interrupted", "reason": "Ctrl-C"}
                    for p, t in targets.items() if p not in finished]
    finally:
        remove_staging(args.out, options["run"])  # left by a worker that died while writing
    bar.close()
    records.sort(key=lambda r: r["model"])
    if args.report:
        write_report(args.report, records, interrupted)
    if interrupted:
        print(f"egraph-opt onnx: interrupted after {len(finished)} of {len(targets)} models"
              + (f"; report in {args.report}" if args.report else ""), file=sys.stderr)
        return 130
    print(summary(records))
    return int(any(r["status"] not in ("optimized", "kept") for r in records))


def _checked_inputs(args: argparse.Namespace) -> list[str]:
    """The models to optimize, once the options agree, --out and --report are writable and the
    profile database is not another file: a mistake fails the run up front, not after every model."""
    if args.cluster and args.jobs > 1:
        raise Failure("-j and --cluster exclude each other: a cluster's size is its workers'")
    if args.no_shared_fs and not args.cluster:
        raise Failure("--no-shared-fs goes with --cluster")
    _writable_dir(args.out, "--out")
    if args.report:
        if os.path.isdir(args.report):
            raise Failure(f"--report {args.report}: is a directory")
        _writable_dir(os.path.dirname(os.path.abspath(args.report)), "--report")
    paths, skipped = collect(args.inputs, args.out)
    if not paths and skipped:
        more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        raise Failure(f"no models to optimize: {skipped[0]}{more} lie in --out {args.out}, where "
                      ".onnx files are outputs: write the outputs to another directory")
    if not paths:
        raise Failure(f"no models found in {' '.join(args.inputs)}")
    args.profile_db = args.profile_db or str(default_path())
    try:
        ProfileDB(args.profile_db).close()
    except UNUSABLE as e:  # locked, another schema, unreadable: each model warns, as before
        if isinstance(e, ForeignFileError):  # the user's own file: each model would only warn
            raise Failure(str(e)) from None  # and price by static estimates
    return paths


def _targets(paths: list[str], out: str, records: list[dict]) -> dict[str, str]:
    """Each model's output path; a model whose file name another already takes fails (in ``records``)."""
    targets: dict[str, str] = {}
    for p in paths:
        if (target := os.path.join(out, os.path.basename(p))) in targets.values():
            first = next(q for q, t in targets.items() if t == target)
            records.append({"model": p, "output": target, "status": "failed",
                            "reason": f"{first} is also written to {target} (the same file name)"})
            print(line(records[-1]))
        else:
            targets[p] = target
    return targets


def add_onnx_command(subparsers) -> argparse.ArgumentParser:
    """Register ``onnx`` on the CLI's subparsers; the parsed namespace's ``run`` executes it."""
    newest = onnx.defs.onnx_opset_version()
    parser = subparsers.add_parser("onnx", help="optimize ONNX models in batch", description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", metavar="IN", help="model files, directories, globs")
    parser.add_argument("--out", required=True, help="directory for the optimized models")
    parser.add_argument("-j", "--jobs", type=at_least(1), default=1, help="parallel worker processes")
    parser.add_argument("--force", action="store_true", help="overwrite existing outputs")
    parser.add_argument("--report", help="write a report of every model here: one HTML page for .html, else JSON")
    parser.add_argument("--objective", default="balanced", choices=[o.value for o in Objective])
    parser.add_argument("--latency-runs", type=at_least(0), default=20, help="onnxruntime runs per model for the "
                        "latency columns; a model measured slower is written as it was (0: no runs, no such check)")
    parser.add_argument("--seed", type=at_least(0), default=0, help="seed of the random validation inputs")
    opset = argument(lambda text: int(text) if text.isdigit() and 13 <= int(text) <= newest else None,
                     f": an opset from 13 to {newest}")
    parser.add_argument("--opset", type=opset, help="convert older models to this opset first, so that "
                        "its fused operators (Attention at 23) can be used; default: keep each model's")
    parser.add_argument("--profile-db", help="price kernels by the latencies measured in this "
                        "database (default: the user's, $EGRAPH_OPT_PROFILE_DB or the cache folder's)")
    parser.add_argument("--profile-budget", metavar="SECONDS", help="per model, time the kernels the database has not "
                        "measured for up to this long and record them (default: $EGRAPH_OPT_PROFILE_BUDGET or 2; "
                        "0: none)", type=argument(budget_seconds, ": a number of seconds >= 0"))
    parser.add_argument("--cluster", metavar="ADDRESS", type=_cluster_address,
                        help="run on Dask distributed: a scheduler address (tcp://host:8786), or "
                        "local:N for a cluster of N worker processes started for this run")
    parser.add_argument("--no-shared-fs", action="store_true", help="with --cluster: send each model's bytes to "
                        "the workers and write their results here (workers do not see this machine's files)")
    parser.set_defaults(run=run)
    return parser


def _cluster_address(text: str) -> str:
    """``local:N`` (N >= 1) or a scheduler address; a scheduler is reached only when the run starts."""
    if text.startswith("local:"):
        if not text.removeprefix("local:").isdigit() or int(text.removeprefix("local:")) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: local:N needs N, the worker count, >= 1")
    elif not text or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r}: a scheduler address (tcp://host:8786) or local:N")
    return text
