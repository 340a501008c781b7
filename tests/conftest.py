import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # test modules share model builders (test_fusion)
os.environ.setdefault("EGRAPH_OPT_TRIPWIRES", "1")  # invariant tripwires on in every test
os.environ.setdefault("TRITON_INTERPRET", "1")  # no GPU here: Triton kernels run interpreted
# never the user's latency database: one per test session, empty (roofline defaults)
# static estimates unless a test asks for timing: the same plans on every machine and run
os.environ.setdefault("EGRAPH_OPT_PROFILE_BUDGET", "0")
os.environ.setdefault("EGRAPH_OPT_PROFILE_DB",
                      os.path.join(tempfile.mkdtemp(prefix="egraph-opt-tests-"), "profile.sqlite"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
