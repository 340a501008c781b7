import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # test modules share model builders (test_fusion)


@pytest.fixture(autouse=True, scope="session")
def _own_profile_db(tmp_path_factory):
    """Each test process (one per xdist worker) times into a latency database of its own: never
    the user's, never one two workers write at once. Subprocesses the tests start inherit it."""
    from egraph_opt.profiling.profile_db import ENV_VAR
    before = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = str(tmp_path_factory.mktemp("profile") / "profile.sqlite")
    yield
    if before is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ[ENV_VAR] = before


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _idle_machine(monkeypatch):
    """The plan-time profiler times nothing on a loaded machine (its timings would be other
    processes'): a test that asks it to time runs beside other tests, so it sees an idle machine
    unless it sets the load itself."""
    from egraph_opt.profiling import latency
    monkeypatch.setattr(latency, "machine_busy", lambda: None)
