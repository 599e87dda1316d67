from __future__ import annotations

import pytest
import torch

from tests.helpers import MLP


@pytest.fixture
def mlp() -> MLP:
    torch.manual_seed(0)
    return MLP()
