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
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from egraph_opt.drivers import cli
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
    assert cli.main(["onnx", model, *args(tmp_path), "--latency-runs", "0"]) == 1
    assert message in _one_line(capsys)
    assert [p.name for p in tmp_path.rglob("*.onnx")] == ["tiny.onnx"]  # the input, no output


def test_a_report_in_a_missing_directory_is_created(model, tmp_path):
    report = tmp_path / "new" / "dir" / "report.json"
    assert cli.main(["onnx", model, "--out", str(tmp_path / "out"), "--report", str(report),
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
    sys.exit(cli.main(["onnx", model, "--out", out, "--latency-runs", "0"]))


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


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _models(folder, count: int, external: bool = False) -> str:
    folder.mkdir()
    for i in range(count):
        name = f"tiny{i}.onnx"
        onnx.save(tiny_model(), str(folder / name), save_as_external_data=external,
                  location=name + ".data", size_threshold=0)
    return str(folder)


def _statuses(text: str) -> dict[str, str]:
    return {os.path.basename(line.split()[1].rstrip(":")): line.split()[0]
            for line in text.splitlines() if line.startswith(("ok ", "kept ", "FAILED "))}


def test_workers_die_with_a_killed_driver_and_a_rerun_finishes_the_rest(tmp_path, capsys):
    """kill -9 of ``-j 2``'s driver: its workers exit (they went on writing, then hung in a pipe
    read); the same command again keeps what was written, writes the rest and exits 0."""
    models, out = _models(tmp_path / "in", 3), tmp_path / "out"
    argv = [models, "--out", str(out), "--latency-runs", "20000"]
    driver = subprocess.Popen([sys.executable, "-u", "-m", "egraph_opt.drivers.cli", "onnx", *argv,
                               "-j", "2"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = driver.stdout.readline()  # one model written, the two workers on the others
        assert first.startswith("ok "), first
        workers = [p for p in _children(driver.pid) if p != driver.pid]
        assert len(workers) >= 2
    finally:
        driver.kill()
        driver.wait(60)
    deadline = time.monotonic() + 60
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, workers))
    written = sorted(n for n in os.listdir(out) if not n.startswith("."))
    assert cli.main(["onnx", *argv]) == 0
    statuses = _statuses(capsys.readouterr().out)
    assert {n for n, s in statuses.items() if s == "kept"} == set(written)
    assert {n for n, s in statuses.items() if s == "ok"} == {f"tiny{i}.onnx" for i in range(3)} - set(written)
    assert sorted(os.listdir(out)) == [f"tiny{i}.onnx" for i in range(3)]  # no staging folder
    for name in os.listdir(out):
        onnx.checker.check_model(str(out / name), full_check=True)


#: the CLI killed (SIGKILL, itself) at its ``n``th hard link: while claiming its output
_KILLED_AT_LINK = ("import os, signal, sys\n"
                   "from egraph_opt.drivers.cli import main\n"
                   "links = []\n"
                   "def hook(event, args):\n"
                   "    if event == 'os.link':\n"
                   "        links.append(args)\n"
                   "        if len(links) == int(sys.argv[1]):\n"
                   "            os.kill(os.getpid(), signal.SIGKILL)\n"
                   "sys.addaudithook(hook)\n"
                   "sys.exit(main(['onnx', *sys.argv[2:]]))\n")


def test_a_run_killed_while_staging_leaves_nothing_a_rerun_keeps(tmp_path, capsys):
    """Killed between linking a model's data and the model: its staging folder and the data
    file alone are left; the next run removes both (no live process owns them) and writes the
    whole model."""
    models, out = _models(tmp_path / "in", 1, external=True), tmp_path / "out"
    argv = [models, "--out", str(out), "--latency-runs", "0"]
    killed = subprocess.run([sys.executable, "-c", _KILLED_AT_LINK, "2", *argv], capture_output=True,
                            timeout=300)
    assert killed.returncode == -signal.SIGKILL
    left = sorted(os.listdir(out))
    assert left[0].startswith(".egraph-opt-") and left[1:] == ["tiny0.onnx.data"]
    assert cli.main(["onnx", *argv]) == 0
    assert _statuses(capsys.readouterr().out) == {"tiny0.onnx": "ok"}
    assert sorted(os.listdir(out)) == ["tiny0.onnx", "tiny0.onnx.data"]
    feeds = random_feeds(tiny_model())
    np.testing.assert_allclose(session(str(out / "tiny0.onnx")).run(None, feeds)[0],
                               session(tiny_model()).run(None, feeds)[0], atol=1e-6)


_STAGING_HELD = ("import sys\n"
                 "from egraph_opt.drivers.staging import claim\n"
                 "def stage(folder):\n"
                 "    open(folder + '/theirs.onnx', 'w').write('theirs')\n"
                 "    print('staged', flush=True)\n"
                 "    sys.stdin.readline()\n"
                 "claim(stage, sys.argv[1], ['theirs.onnx'])\n")


def test_a_staging_folder_a_live_process_holds_is_left_alone(model, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    other = subprocess.Popen([sys.executable, "-c", _STAGING_HELD, str(out / "theirs.onnx")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline() == "staged\n"
        (folder,) = out.glob(".egraph-opt-*")
        assert cli.main(["onnx", model, "--out", str(out), "--latency-runs", "0"]) == 0
        assert folder.is_dir()
        other.stdin.write("\n")
        other.stdin.close()
        assert other.wait(60) == 0
    finally:
        other.kill()
    assert sorted(os.listdir(out)) == ["theirs.onnx", "tiny.onnx"]


def test_an_output_folder_holding_the_inputs_is_one_clear_error(model, capsys):
    folder = os.path.dirname(model)
    assert cli.main(["onnx", folder, "--out", folder, "--latency-runs", "0"]) == 1
    assert f"{model} lie in --out {folder}, where .onnx files are outputs" in _one_line(capsys)
    assert os.listdir(folder) == ["tiny.onnx"]


def test_two_inputs_of_one_file_name_fail_the_second_with_its_line(model, tmp_path, capsys):
    (tmp_path / "other").mkdir()
    twin = str(tmp_path / "other" / "tiny.onnx")
    os.link(model, twin)
    assert cli.main(["onnx", model, twin, "--out", str(tmp_path / "out"), "--latency-runs", "0"]) == 1
    out = capsys.readouterr().out
    assert f"FAILED {twin}: {model} is also written to" in out and f"ok     {model}" in out
    assert os.listdir(tmp_path / "out") == ["tiny.onnx"]


def test_a_file_in_the_way_is_not_kept(model, tmp_path, capsys):
    """Only an output made from this model, with these options, counts as the rerun's."""
    out = tmp_path / "out"
    out.mkdir()
    onnx.save(tiny_model(), str(out / "tiny.onnx"))  # the input itself, not an output of it
    assert cli.main(["onnx", model, "--out", str(out), "--latency-runs", "0"]) == 1
    assert "tiny.onnx exists (use --force" in capsys.readouterr().out
    assert cli.main(["onnx", model, "--out", str(out), "--latency-runs", "0", "--force"]) == 0
    assert cli.main(["onnx", model, "--out", str(out), "--latency-runs", "0", "--seed", "1"]) == 1
    assert "exists (made from this model with other options)" in capsys.readouterr().out
    assert cli.main(["onnx", model, "--out", str(out), "--latency-runs", "0"]) == 0
    assert "kept " in capsys.readouterr().out


@pytest.mark.parametrize("command", [
    lambda model, db, out: ["onnx", model, "--out", out, "--latency-runs", "0", "--profile-db", db],
    lambda model, db, out: ["profile", "--ops", "exp", "--sizes", "4", "--repeats", "1", "--db", db],
])
def test_a_profile_database_path_holding_the_users_file_is_refused(model, tmp_path, capsys, command):
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's notes\n")
    assert cli.main(command(model, str(notes), str(tmp_path / "out"))) == 1
    assert f"profile database {notes} is not an SQLite database, not egraph-opt's" in _one_line(capsys)
    assert notes.read_text() == "the user's notes\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("notes")] == ["notes.txt"]
