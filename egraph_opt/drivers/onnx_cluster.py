"""``egraph-opt onnx IN... --out DIR --cluster ADDRESS``: the batch on Dask distributed workers.

The work per model is ``onnx_batch.process``, as in-process: the cluster only carries it, so records, report and exit
status are the same. Workers price kernels from databases of their own (``ProfileFile``), merged into the user's."""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

import onnx

from ..frontends.onnx_frontend import external_files
from ..profiling.latency import without_database
from ..profiling.profile_db import UNUSABLE, ProfileDB, ProfileDBWarning
from .staging import earlier_output, write_files
from .usage import Failure, ModelFailure

try:
    from distributed import WorkerPlugin
except ImportError:  # the cluster extra is not installed: the CLI says so (usage.require)
    WorkerPlugin = object

RETRIES = 2  # tries after the first, for a model whose worker died (local:N)
PER_WORKER = 2  # models in flight per worker thread: each busy, not every model's bytes read at once
_STOP_EVERY_S = 0.1  # how often a running model asks whether the run was interrupted


class ProfileFile(WorkerPlugin):
    """A worker's own latency database, in its local directory, seeded with ``records``: no two
    processes of a cluster share an SQLite file (a network file system would not lock it)."""

    def __init__(self, records: list):
        self.records, self.path, self.seeded = records, "", 0

    def setup(self, worker):
        self.path = os.path.join(worker.local_directory, "egraph-opt-profile.sqlite")
        with ProfileDB(self.path) as db:
            db.add_many(self.records)
            self.seeded = db.since()[1]

    def teardown(self, worker):
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.unlink(self.path + suffix)


def _named(what: str, options: dict) -> str:
    return f"egraph-opt-{what}-{options['run']}"  # one per run: runs may share a cluster


def _new_rows(name: str, dask_worker=None) -> list:
    """The rows a worker measured itself (run on each worker at the end)."""
    if (plugin := dask_worker.plugins.get(name)) is None or not plugin.path:
        return []
    with ProfileDB(plugin.path) as db:
        return db.since(plugin.seeded)[0]


class _Stopped:
    """True once the driver set the run's stop event (Ctrl-C): a running model stops between steps."""

    def __init__(self, name: str):
        self.name, self.stop, self.next = name, False, 0.0

    def __call__(self) -> bool:
        if not self.stop and time.monotonic() >= self.next:
            from distributed import Event
            self.next, self.stop = time.monotonic() + _STOP_EVERY_S, Event(self.name).is_set()
        return self.stop


def _work(process: Callable, path: str, target: str, options: dict, files: dict[str, bytes] | None):
    """On a worker: ``process`` one model (``onnx_batch.process``) through the shared file system,
    or (``files``: the model's and its data files' bytes) in a folder of its own, returning the output's."""
    from distributed import get_worker
    worker = get_worker()
    plugin = worker.plugins.get(_named("profile", options))  # never the driver's path: not this machine's
    options = dict(options, profile_db=plugin.path if plugin is not None else None)
    stopped = _Stopped(_named("stop", options))
    if files is None:
        return process(path, target, options, stopped), None
    with tempfile.TemporaryDirectory(prefix="egraph-opt-", dir=worker.local_directory) as folder:
        for name, data in files.items():
            Path(folder, "in", name).parent.mkdir(parents=True, exist_ok=True)
            Path(folder, "in", name).write_bytes(data)
        os.mkdir(os.path.join(folder, "out"))
        record = process(os.path.join(folder, "in", os.path.basename(path)),
                         os.path.join(folder, "out", os.path.basename(target)),
                         dict(options, force=True, run=""), stopped)
        outputs = {name: Path(folder, "out", name).read_bytes() for name in os.listdir(os.path.join(folder, "out"))}
    return record, outputs if record["status"] == "optimized" else None


def _files(path: str) -> dict[str, bytes]:
    """The model's and its data files' bytes by name; an unreadable model goes alone, its worker says why."""
    names = [os.path.basename(path)]
    with contextlib.suppress(Exception):  # unreadable: the worker's reason is the one in-process gives
        names += map(os.path.normpath, external_files(path, onnx.load(path, load_external_data=False)))
    files = {}
    for name in names:
        with contextlib.suppress(OSError):  # a missing model too: the worker says so
            files[name] = Path(os.path.dirname(path), name).read_bytes()
    return files


def _outcome(future, path: str, target: str, options: dict) -> dict:
    from distributed import KilledWorker
    try:
        record, files = future.result()
    except KilledWorker as e:
        return {"model": path, "output": target, "status": "failed", "reason": f"worker died: each of "
                f"the {e.allowed_failures + 1} workers that tried it died (the last: {e.last_worker.address})"}
    except Exception as e:  # noqa: BLE001 - a model that no worker could run
        return {"model": path, "output": target, "status": "failed",
                "reason": f"worker failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    # with the paths as the user gave them, not as the worker saw them
    reason = record["reason"].replace(record["model"], path).replace(record["output"], target)
    record = {**record, "model": path, "output": target, "reason": reason}
    if files is not None:  # --no-shared-fs: the output is written here, by the same claim
        try:
            write_files(files, target, options["force"], options["run"])
        except (ModelFailure, OSError) as e:
            record.update(status="failed", reason=str(e).splitlines()[0])
    return record


def _connect(address: str, stack: contextlib.ExitStack):
    import dask
    from distributed import Client, LocalCluster
    if address.startswith("local:"):
        with dask.config.set({"distributed.scheduler.allowed-failures": RETRIES}):
            cluster = stack.enter_context(LocalCluster(
                n_workers=int(address.removeprefix("local:")), threads_per_worker=1, processes=True,
                dashboard_address=":0", silence_logs=logging.ERROR))
        return stack.enter_context(Client(cluster))
    try:
        return stack.enter_context(Client(address, timeout="30s"))
    except (OSError, TimeoutError, ValueError) as e:
        raise Failure(f"--cluster {address}: cannot reach the scheduler ({e})") from None


def on_cluster(process: Callable, address: str, targets: dict[str, str], options: dict,
               done: Callable[[dict], None], shared_fs: bool = True) -> None:
    """``process`` every model of ``targets`` on the cluster at ``address``, ``done`` called with each record.
    Ctrl-C stops the run's models (queued, running), merges the latencies measured, then propagates."""
    from distributed import Event, as_completed  # installed: the CLI requires the cluster extra first
    with contextlib.ExitStack() as stack:
        client = _connect(address, stack)
        options = dict(_share_database(client, options), same_is_ours=True)  # targets checked absent first
        waiting, running, count, finished = iter(targets.items()), {}, itertools.count(), as_completed()
        def submit() -> None:
            for path, target in waiting:
                if not options["force"] and (earlier := earlier_output(path, target, options)) is not None:
                    done({"model": path, "output": target, "seconds": 0.0, **earlier})
                    continue  # kept (an earlier run's), or a file in the way
                where, files = ((os.path.abspath(path), os.path.abspath(target)), None) if shared_fs else \
                    ((path, target), _files(path))  # shared: the workers' working directory need not be this one
                future = client.submit(_work, process, *where, options, files, pure=False,
                                       key=f"egraph-opt-{options['run']}-{next(count)}-{os.path.basename(path)}")
                running[future] = path
                finished.add(future)
                return
        try:
            for _ in range(max(2, PER_WORKER * sum(client.nthreads().values()))):
                submit()
            for future in finished:
                path = running.pop(future)
                done(_outcome(future, path, targets[path], options))
                submit()
        except KeyboardInterrupt:
            Event(_named("stop", options), client=client).set()
            client.cancel([f for f in running if f.status != "finished"], force=True)
            for future, path in running.items():
                if future.status == "finished":  # its output is written: so is its record
                    done(_outcome(future, path, targets[path], options))
            raise
        finally:
            if options.get("profile_db"):
                _merge(client, options)


def _share_database(client, options: dict) -> dict:
    """Each worker prices by a plugin-seeded copy of the user's database; the options, without an unusable one."""
    if options.get("profile_db"):
        try:
            with ProfileDB(options["profile_db"]) as db:
                seed = db.since()[0]
        except UNUSABLE as e:  # as in-process: static estimates, and one warning
            without_database(e)
            return dict(options, profile_db=None)
        client.register_plugin(ProfileFile(seed), name=_named("profile", options))
    return options


def _merge(client, options: dict) -> None:
    """The rows the workers measured, into the user's database in one transaction; then they drop theirs."""
    rows = [r for found in client.run(_new_rows, _named("profile", options), on_error="ignore").values()
            if isinstance(found, list) for r in found]
    try:
        with ProfileDB(options["profile_db"]) as db:
            db.add_many(rows)
    except UNUSABLE as e:  # the batch's outputs and report matter more than these timings
        warnings.warn(f"{len(rows)} latencies measured by the workers not merged: {e}", ProfileDBWarning, stacklevel=2)
    client.unregister_worker_plugin(_named("profile", options))
