import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # test modules share model builders (test_fusion)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
