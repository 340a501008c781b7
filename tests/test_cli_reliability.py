"""The CLI under bad arguments, unusable paths, concurrent runs and Ctrl-C: one line on stderr with
exit status 2 (usage), 1 (failure) or 130 (interrupted), never a traceback, never a lost file.

Read-only places: the tests run as root, which chmod does not stop, so they use what stops root
too: a path under a regular file, and sysfs (/sys/kernel), where nobody can create files.
"""
import json
import multiprocessing
import os
import signal
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from egraph_opt.drivers import cli
from egraph_opt.drivers.cli import main_onnx
from egraph_opt.drivers.onnx_batch import ModelFailure, random_feeds, session, write_atomic
from test_profile_db import corrupt_a_page

SYSFS = "/sys/kernel"  # an existing directory in which even root cannot create a file
needs_sysfs = pytest.mark.skipif(not os.path.isdir(SYSFS), reason="no sysfs on this system")


def tiny_model() -> onnx.ModelProto:
    """log(exp(x)) + w: optimized in well under a second, with a weight to store externally."""
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Log", ["e"], ["l"]),
             helper.make_node("Add", ["l", "w"], ["y"])]
    w = onnx.numpy_helper.from_array(np.linspace(-1, 1, 512, dtype=np.float32), "w")
    vec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 512]) for n in "xy"]
    graph = helper.make_graph(nodes, "tiny", vec[:1], vec[1:], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.fixture
def model(tmp_path) -> str:
    path = tmp_path / "in" / "tiny.onnx"
    path.parent.mkdir()
    onnx.save(tiny_model(), str(path))
    return str(path)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv, message", [
    (["onnx", "m.onnx", "--out", "o", "--latency-runs", "-1"], "--latency-runs: '-1' is not"),
    (["onnx", "m.onnx", "--out", "o", "--seed", "-3"], "--seed: '-3' is not an integer >= 0"),
    (["onnx", "m.onnx", "--out", "o", "-j", "0"], "--jobs: '0' is not an integer >= 1"),
    (["profile", "--repeats", "0"], "--repeats: '0' is not an integer >= 1"),
    (["profile", "--threads", "0"], "--threads: '0' is not"),
    (["profile", "--sizes", "16,0"], "--sizes: '16,0': '0' is not"),
    (["profile", "--dtype", "float99"], "--dtype: 'float99' is not a torch dtype"),
    (["profile", "--device", "nope"], "--device: 'nope' is not a torch device"),
    (["profile", "--for", "m:f", "--shapes", "2xa"], "--shapes: '2xa': 'a' is not"),
    (["profile", "--for", "m:f"], "--for needs --shapes"),
])
def test_a_bad_argument_is_one_usage_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and message in _one_line(capsys)


def _file(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    return tmp_path / "file"


@pytest.mark.parametrize("args, message", [
    (lambda t: ["--out", str(_file(t))], "is a file, not a directory"),
    (lambda t: ["--out", str(_file(t) / "out")], "Not a directory"),
    pytest.param(lambda t: ["--out", f"{SYSFS}/egraph-opt-out"], "cannot write there",
                 marks=needs_sysfs),
    pytest.param(lambda t: ["--out", SYSFS], "cannot write there", marks=needs_sysfs),
    (lambda t: ["--out", str(t / "out"), "--report", str(t)], "is a directory"),
    (lambda t: ["--out", str(t / "out"), "--report", str(_file(t) / "r.json")], "is a file"),
])
def test_an_unusable_output_fails_up_front_in_one_line(model, tmp_path, args, message, capsys):
    assert main_onnx([model, *args(tmp_path), "--latency-runs", "0"]) == 1
    assert message in _one_line(capsys)
    assert [p.name for p in tmp_path.rglob("*.onnx")] == ["tiny.onnx"]  # the input, no output


def test_a_report_in_a_missing_directory_is_created(model, tmp_path):
    report = tmp_path / "new" / "dir" / "report.json"
    assert main_onnx([model, "--out", str(tmp_path / "out"), "--report", str(report),
                      "--latency-runs", "0"]) == 0
    (record,) = json.loads(report.read_text())["models"]
    assert record["status"] == "optimized"


@pytest.mark.parametrize("db, message", [
    (lambda t: t, "is a directory"),
    (lambda t: _file(t) / "p.sqlite", "cannot use profile database"),
    pytest.param(lambda t: f"{SYSFS}/p.sqlite", "unable to open", marks=needs_sysfs),
])
def test_profile_with_an_unusable_database_fails_in_one_line(tmp_path, db, message, capsys):
    assert cli.main(["profile", "--ops", "exp", "--sizes", "4", "--repeats", "1",
                     "--db", str(db(tmp_path))]) == 1
    assert message in _one_line(capsys)


def test_profile_sets_a_corrupted_database_aside_with_one_warning(tmp_path, capsys):
    db = tmp_path / "p.sqlite"
    corrupt_a_page(db)
    assert cli.main(["profile", "--ops", "exp", "--sizes", "4", "--repeats", "1",
                     "--db", str(db)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # one warning on the database (a busy machine adds one of its own: "load average ...")
    (warning,) = [line for line in err.splitlines() if "warning" in line and "load average" not in line]
    assert warning.startswith("egraph-opt profile: warning: profile database")
    assert "corrupt SQLite file" in warning
    assert len(list(tmp_path.glob("p.sqlite.corrupt-*"))) == 1


def _race(model, out, barrier):
    barrier.wait()  # both past their start-up: both optimize at once and write at once
    sys.exit(main_onnx([model, "--out", out, "--latency-runs", "0"]))


def test_of_two_runs_writing_one_output_only_one_succeeds(model, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    runs = [ctx.Process(target=_race, args=(model, str(tmp_path / "out"), barrier))
            for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(120)
    assert sorted(run.exitcode for run in runs) == [0, 1]
    assert os.listdir(tmp_path / "out") == ["tiny.onnx"]
    onnx.checker.check_model(str(tmp_path / "out" / "tiny.onnx"), full_check=True)


def test_a_model_and_its_external_data_are_claimed_as_one_unit(tmp_path):
    target = str(tmp_path / "tiny.onnx")
    (tmp_path / "tiny.onnx.data").write_bytes(b"someone else's data")
    with pytest.raises(ModelFailure, match="tiny.onnx.data exists"):
        write_atomic(tiny_model(), target, external=True)
    assert sorted(os.listdir(tmp_path)) == ["tiny.onnx.data"]  # no model, their data untouched
    assert (tmp_path / "tiny.onnx.data").read_bytes() == b"someone else's data"

    write_atomic(tiny_model(), target, external=True, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["tiny.onnx", "tiny.onnx.data"]
    feeds = random_feeds(tiny_model())
    expected = session(tiny_model()).run(None, feeds)
    np.testing.assert_array_equal(session(target).run(None, feeds)[0], expected[0])
    with pytest.raises(ModelFailure, match="tiny.onnx.data exists"):
        write_atomic(tiny_model(), target, external=True)  # a second claim of the pair fails
    write_atomic(tiny_model(), target, external=False, overwrite=True)
    assert os.listdir(tmp_path) == ["tiny.onnx"]  # the old model's data went with it


def test_ctrl_c_stops_with_one_line_and_writes_the_partial_report(model, tmp_path):
    for i in (2, 3):
        os.link(model, os.path.join(os.path.dirname(model), f"tiny{i}.onnx"))
    report = tmp_path / "report.json"
    run = subprocess.Popen(
        [sys.executable, "-u", "-m", "egraph_opt.drivers.cli", "onnx", os.path.dirname(model),
         "--out", str(tmp_path / "out"), "--report", str(report), "--latency-runs", "30000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not ignored, as in `&`
    try:
        assert run.stdout.readline().startswith("ok ")  # the first model done, the second running
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130
    assert err.count("\n") == 1 and "interrupted after 1 of 3 models" in err, err
    records = json.loads(report.read_text())
    assert records["interrupted"] is True
    assert [r["status"] for r in records["models"]] == ["optimized", "interrupted", "interrupted"]
    assert os.listdir(tmp_path / "out") == ["tiny.onnx"]  # no half-written model, no staging folder
