"""The command line behaves as Unix tools do: ``--version``, a reader that leaves early (``| head``)
ends it quietly, a bad choice lists the good ones, and every file it writes gets the user's umask."""
import os
import stat
import subprocess
import sys

import pytest

from egraph_opt import saturate_and_extract
from egraph_opt.drivers import cli
from egraph_opt.drivers.onnx_batch import write_report
from egraph_opt.drivers.staging import write_atomic
from test_cli_reliability import tiny_model

PROGRAM = [sys.executable, "-m", "egraph_opt.drivers.cli"]


def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"egraph-opt {version('egraph-opt')}"


def test_a_reader_that_leaves_early_ends_the_listing_quietly():
    """``egraph-opt rules | head -1``: the pipe closes after one line; exit 0, nothing on stderr."""
    run = subprocess.Popen([*PROGRAM, "rules"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = run.stdout.readline()
    run.stdout.close()  # as head does
    err = run.stderr.read().decode()
    assert run.wait(timeout=120) == 0 and first and err == ""


def test_a_bad_objective_lists_the_good_ones():
    with pytest.raises(ValueError, match="'fast' is not an objective; use one of stability, latency, "
                                         "balanced, tolerance"):
        saturate_and_extract(lambda x: x, objective="fast")


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o640
    os.umask(old)


def test_reports_and_external_data_get_the_users_umask(tmp_path, umask_027):
    """As the .onnx file does: mkstemp and onnx's external data would make them 0600."""
    target = str(tmp_path / "tiny.onnx")
    write_atomic(tiny_model(), target, external=True)
    for name in ("r.json", "r.html"):
        write_report(str(tmp_path / name), [{"model": "m", "status": "failed", "reason": "r"}], False)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == dict.fromkeys(["tiny.onnx", "tiny.onnx.data", "r.json", "r.html"], umask_027)
