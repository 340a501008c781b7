import os

import pytest
import torch

os.environ.setdefault("EGRAPH_OPT_TRIPWIRES", "1")  # invariant tripwires on in every test
os.environ.setdefault("TRITON_INTERPRET", "1")  # no GPU here: Triton kernels run interpreted


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
