import os

import pytest
import torch

os.environ.setdefault("EGRAPH_OPT_TRIPWIRES", "1")  # invariant tripwires on in every test


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
