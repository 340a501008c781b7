import subprocess
import sys

from egraph_opt import cli, demo
from egraph_opt.rulesets import catalogue


def test_rules_command_lists_the_whole_catalogue(capsys):
    assert cli.main(["rules"]) == 0
    out = capsys.readouterr().out
    for name in catalogue():
        assert name in out
    assert f"{len(catalogue())} rules" in out


def test_rules_command_filters_by_family(capsys):
    cli.main(["rules", "--family", "fusion"])
    out = capsys.readouterr().out
    assert "attention-fuse" in out and "softmax-fuse" not in out


def test_console_script_entry_point_runs():
    done = subprocess.run([sys.executable, "-m", "egraph_opt.cli", "rules"], capture_output=True,
                          text=True, check=True)
    assert "softmax-fuse" in done.stdout


def test_demo_shows_naive_nan_and_optimized_accuracy(capsys):
    assert demo.main() == 0
    out = capsys.readouterr().out
    assert "naive non-finite  99.0%" in out or "naive non-finite 100.0%" in out
    assert "optimized program matches float64 everywhere" in out
