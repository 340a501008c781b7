"""``egraph-opt onnx --cluster``: a real Dask LocalCluster of 2 worker processes, shared by the
tests; workers are killed for real (a worker plugin ends its own process), never mocked."""
from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper

distributed = pytest.importorskip("distributed")
import cloudpickle  # noqa: E402 - a dependency of distributed

from egraph_opt.drivers import cli  # noqa: E402
from egraph_opt.drivers.onnx_batch import random_feeds, session  # noqa: E402
from egraph_opt.profiling.profile_db import ProfileDB, Record  # noqa: E402
from egraph_opt.profiling.profiler import device_name  # noqa: E402
from test_cli_reliability import tiny_model  # noqa: E402
from test_onnx import _malformed  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this file


def softmax_model() -> onnx.ModelProto:
    """exp(x - max x) / sum exp(...) over the last axis, times a weight: fuses into Softmax."""
    axes = onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes")
    w = onnx.numpy_helper.from_array(np.linspace(0.5, 2, 16, dtype=np.float32), "w")
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], axes=[-1], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["d"]), helper.make_node("Exp", ["d"], ["e"]),
             helper.make_node("ReduceSum", ["e", "axes"], ["s"], keepdims=1),
             helper.make_node("Div", ["e", "s"], ["p"]), helper.make_node("Mul", ["p", "w"], ["y"])]
    vec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 16]) for n in "xy"]
    graph = helper.make_graph(nodes, "softmax", vec[:1], vec[1:], [axes, w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


ALLOWED_FAILURES = 1  # this scheduler's (as of any existing cluster): fewer restarts than RETRIES


@pytest.fixture(scope="module")
def client():
    import dask
    with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=":0", silence_logs=50)
    with cluster, distributed.Client(cluster) as c:
        yield c


def _models(folder, names, make=tiny_model) -> str:
    folder.mkdir(exist_ok=True)
    for name in names:
        onnx.save(make(), str(folder / f"{name}.onnx"))
    return str(folder)


def _batch(args, report) -> tuple[int, dict]:
    rc = cli.main(["onnx", *args, "--latency-runs", "0", "--report", str(report)])
    return rc, {os.path.basename(r["model"]): r for r in json.loads(report.read_text())["models"]}


def _assert_complete(out):
    """Every file in ``out`` is a whole model (no staging folder, no partial file)."""
    for name in os.listdir(out):
        assert name.endswith((".onnx", ".onnx.data")), name
        if name.endswith(".onnx"):
            onnx.checker.check_model(os.path.join(out, name), full_check=True)


def test_results_equal_in_process(client, tmp_path, capsys):
    models = tmp_path / "models"
    _models(models, ["tiny", "tiny2"])
    _models(models, ["softmax"], softmax_model)
    _malformed("truncated", models)
    rc_here, here = _batch([str(models), "--out", str(tmp_path / "here")], tmp_path / "here.json")
    gc.collect()  # the e-graphs made here die in this thread, not in the client's
    table_here = capsys.readouterr().out.split("\nmodel ", 1)[1]
    rc_there, there = _batch([str(models), "--out", str(tmp_path / "there"), "--cluster",
                              client.scheduler.address], tmp_path / "there.json")
    table_there = capsys.readouterr().out.split("\nmodel ", 1)[1]
    assert rc_here == rc_there == 1 and table_here == table_there
    assert "3 optimized, 1 failed" in table_there
    same = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "output")}  # noqa: E731
    assert {n: same(r) for n, r in here.items()} == {n: same(r) for n, r in there.items()}
    assert there["softmax.onnx"]["ops_after"].get("softmax") == 1
    assert "truncated or corrupt" in there["truncated.onnx"]["reason"]
    assert sorted(os.listdir(tmp_path / "there")) == ["softmax.onnx", "tiny.onnx", "tiny2.onnx"]


def test_local_cluster_without_shared_files_sends_models_with_their_data(tmp_path, monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    onnx.save_model(tiny_model(), str(models / "ext.onnx"), save_as_external_data=True,
                    location="ext.weights", size_threshold=0)
    _models(models, ["plain"], softmax_model)
    monkeypatch.chdir(tmp_path)  # relative paths, as the user typed them, in the records
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    rc, records = _batch(["models", "--out", "out", "--cluster", "local:2", "--no-shared-fs"],
                         tmp_path / "report.json")
    assert rc == 0 and {r["status"] for r in records.values()} == {"optimized"}
    assert records["ext.onnx"]["model"] == os.path.join("models", "ext.onnx")
    assert records["ext.onnx"]["output"] == os.path.join("out", "ext.onnx")
    assert sorted(os.listdir("out")) == ["ext.onnx", "ext.onnx.data", "plain.onnx"]
    _assert_complete("out")
    feeds = random_feeds(tiny_model())
    np.testing.assert_allclose(session("out/ext.onnx").run(None, feeds)[0],
                               session(tiny_model()).run(None, feeds)[0], rtol=1e-5, atol=1e-5)
    alive = {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}
    assert alive <= children  # the run's own cluster is stopped


class Killer(distributed.WorkerPlugin):
    """Ends its worker's process when the model ``victim`` runs there: once, while it is in the
    optimizer (``once``), or on every try as soon as it starts."""

    def __init__(self, victim: str, flag: str, once: bool):
        self.victim, self.flag, self.once = victim, flag, once

    def transition(self, key, start, finish, *args, **kwargs):
        if finish != "executing" or not str(key).endswith(self.victim):
            return
        if not self.once:
            os._exit(1)
        if not os.path.exists(self.flag):
            open(self.flag, "w").close()
            threading.Thread(target=self._in_optimizer, args=(threading.get_ident(),),
                             daemon=True).start()

    def _in_optimizer(self, event_loop: int):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for ident, frame in sys._current_frames().items():
                while frame is not None and ident != event_loop:
                    if frame.f_code.co_name == "optimize" and "pipeline" in frame.f_code.co_filename:
                        with open(self.flag, "w") as f:
                            f.write(f"killed {os.getpid()} in optimize")
                        os._exit(1)
                    frame = frame.f_back
            time.sleep(0.001)


def _killing(client, victim: str, flag: str, once: bool):
    client.register_plugin(Killer(victim, flag, once), name="killer")
    return _Unregister(client)


class _Unregister:
    def __init__(self, client):
        self.client = client

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.client.unregister_worker_plugin("killer")
        self.client.wait_for_workers(2, timeout=60)


def test_a_worker_killed_mid_model_is_retried_on_another(client, tmp_path):
    models = _models(tmp_path / "models", ["a", "b", "c", "victim"])
    flag = str(tmp_path / "flag")
    with _killing(client, "victim.onnx", flag, once=True):
        rc, records = _batch([models, "--out", str(tmp_path / "out"), "--cluster",
                              client.scheduler.address], tmp_path / "report.json")
    assert open(flag).read().startswith("killed ")  # its first worker died inside the optimizer
    assert rc == 0 and {r["status"] for r in records.values()} == {"optimized"}
    assert sorted(os.listdir(tmp_path / "out")) == ["a.onnx", "b.onnx", "c.onnx", "victim.onnx"]
    _assert_complete(tmp_path / "out")


def test_a_model_whose_every_worker_dies_fails_with_the_reason(client, tmp_path):
    models = _models(tmp_path / "models", ["doomed", "fine"])
    with _killing(client, "doomed.onnx", str(tmp_path / "flag"), once=False):
        rc, records = _batch([models, "--out", str(tmp_path / "out"), "--cluster",
                              client.scheduler.address], tmp_path / "report.json")
    assert rc == 1 and records["fine.onnx"]["status"] == "optimized"
    assert records["doomed.onnx"]["status"] == "failed"
    assert f"each of the {ALLOWED_FAILURES + 1} workers that tried it died" in records["doomed.onnx"]["reason"]
    assert os.listdir(tmp_path / "out") == ["fine.onnx"]


def test_worker_databases_merge_into_the_users_keeping_their_device_keys(client, tmp_path):
    db = tmp_path / "user.sqlite"
    theirs = Record(kernel="exp", backend="torch", device="cpu: another machine, 64 threads", dtype="float32", shapes=((2, 512),), attrs={},
                    runs=10, median_s=3e-6, spread_s=1e-7)
    with ProfileDB(db) as user:
        user.add(theirs)
    models = _models(tmp_path / "models", ["t1", "t2", "t3", "t4"])
    _models(tmp_path / "models", ["s1", "s2"], softmax_model)
    rc, records = _batch([models, "--out", str(tmp_path / "out"), "--cluster", client.scheduler.address,
                          "--profile-db", str(db), "--profile-budget", "60"], tmp_path / "report.json")
    assert rc == 0
    # a worker times nothing while the machine is busy (its timings would be other processes'),
    # and the model's record says so
    busy = [r["profiling_stopped"] for r in records.values() if "profiling_stopped" in r]
    assert all(why.startswith("load average") for why in busy)
    workers = set(client.run(device_name, "cpu").values())
    with ProfileDB(db) as user:
        assert user._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = user.since()[0]
    assert [r for r in rows if r.device == theirs.device] == [theirs]  # kept, not copied back
    measured = [r for r in rows if r != theirs]
    assert {r.device for r in measured} <= workers
    if not busy:
        assert {r.kernel for r in measured} >= {"exp", "log", "add"}
    assert client.run(lambda dask_worker: [n for n in dask_worker.plugins
                                           if n.startswith("egraph-opt-profile")]) == \
        {w: [] for w in client.nthreads()}  # the workers dropped their files


def test_ctrl_c_cancels_the_run_and_writes_a_partial_report(client, tmp_path, capsys):
    models = _models(tmp_path / "models", [f"m{i}" for i in range(6)])
    out, report = tmp_path / "out", tmp_path / "report.json"
    armed, printed = threading.Event(), []
    armed.set()

    def interrupt():  # Ctrl-C once the first model is reported
        while armed.is_set() and "ok " not in "".join(printed):
            printed.append(capsys.readouterr().out)
            time.sleep(0.01)
        if armed.is_set():
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    def on_sigint(*_):
        if armed.is_set():
            raise KeyboardInterrupt
    previous = signal.signal(signal.SIGINT, on_sigint)
    threading.Thread(target=interrupt, daemon=True).start()
    try:
        rc = cli.main(["onnx", models, "--out", str(out), "--cluster", client.scheduler.address,
                        "--report", str(report), "--latency-runs", "30000"])
    finally:
        armed.clear()
        signal.signal(signal.SIGINT, previous)
    assert rc == 130 and "interrupted after" in capsys.readouterr().err
    records = json.loads(report.read_text())
    statuses = [r["status"] for r in records["models"]]
    assert records["interrupted"] is True and "interrupted" in statuses and "optimized" in statuses
    busy = lambda: sum(client.run(lambda dask_worker: len(dask_worker.state.executing)).values())  # noqa: E731
    deadline = time.monotonic() + 30  # running models stop at their next check, queued ones never run
    while busy() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not busy() and not any(client.processing().values())
    written = {os.path.basename(r["output"]) for r in records["models"] if r["status"] == "optimized"}
    assert written <= set(os.listdir(out)) and len(os.listdir(out)) < 6  # the rest never ran
    _assert_complete(out)  # and no staging folder is left


@pytest.mark.parametrize("args, message", [
    (["--cluster", "local:0"], "--cluster: 'local:0': local:N needs N, the worker count, >= 1"),
    (["--cluster", "local:2", "-j", "2"], "-j and --cluster exclude each other"),
    (["--no-shared-fs"], "--no-shared-fs goes with --cluster"),
])
def test_cluster_arguments_fail_in_one_line(tmp_path, args, message, capsys):
    try:
        rc = cli.main(["onnx", _models(tmp_path / "m", ["t"]), "--out", str(tmp_path / "out"), *args])
    except SystemExit as usage:  # argparse's refusal
        rc = usage.code
    err = capsys.readouterr().err
    assert rc in (1, 2) and message in err and err.count("\n") == 1, err
