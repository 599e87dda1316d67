from __future__ import annotations

from collections.abc import Generator, Iterator

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


@pytest.fixture(autouse=True)
def _no_monitor_left_open(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves a monitor of its own open fails here, and the monitor is closed.

    An open monitor is one of the process's streams: every monitor made after it would
    label its frames as one of several optimizers, so one test failing before its
    ``close()`` used to fail dozens of unrelated tests after it. Monitors made by a
    fixture of a wider scope (open before the test began) are that fixture's to close.
    """
    from sentinel.instrument import registry

    before = {id(m) for m in registry.live_streams()}
    yield
    left = [m for m in registry.live_streams() if id(m) not in before]
    for m in left:
        m.close()
    if left and not getattr(request.node, "_sentinel_failed", False):
        pytest.fail(f"{len(left)} monitor(s) left open by this test (closed now)", pytrace=False)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Mark a test whose own call failed: its leftover monitor needs no second error."""
    report = yield
    if report.when == "call" and report.failed:
        item._sentinel_failed = True  # type: ignore[attr-defined]  # its own failure says enough
    return report
