#!/usr/bin/env bash
# One entry point that sets itself up: `bash scripts/dev.sh demo|test [pytest args]`.
# Creates .venv, installs torch 2.13.0 (CPU build, from this machine's disk) when no torch is
# present, then the package with its test extras; re-installs only when pyproject.toml changes.
# Tests run in one process per core (pytest-xdist); TEST_WORKERS=0 runs them in this one.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
py="$venv/bin/python"
if ! "$py" -c "import torch" >/dev/null 2>&1; then
    "$py" -m pip install -q torch==2.13.0
fi
stamp="$venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    "$py" -m pip install -q -e ".[test]"  # the test extra pulls every other one
    touch "$stamp"
fi
cmd="${1:-test}"; shift || true
case "$cmd" in
    demo) exec "$py" -m egraph_opt.drivers.demo "$@" ;;
    # one worker per core, each given a contiguous half of the suite and stealing from the other's
    # tail when it runs dry: a file's module fixtures and caches are mostly built once, not per worker
    test) exec "$py" -m pytest -n "${TEST_WORKERS:-auto}" --dist worksteal "$@" ;;
    *) echo "usage: bash scripts/dev.sh demo|test [args]" >&2; exit 2 ;;
esac
