from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.helpers import MLP, Receiver


@pytest.fixture
def mlp() -> MLP:
    torch.manual_seed(0)
    return MLP()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real local HTTP server that apprise's json:// posts to (tests/helpers.py)."""
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(autouse=True, scope="session")
def _private_state_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The default outbox file lives under $XDG_STATE_HOME: keep the tests' out of ~."""
    import os

    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
