"""Reinforcement learning: the loss measures no progress (a DQN's temporal-difference loss
climbs as the agent survives longer: its targets are the target network's own growing
estimates), so it is recorded as the scalar ``objective``, which no loss rule judges. A run
is taken for one when the script imported an environment library, or when
``WatchOptions.rl`` says so (tests/programs/dqn.py: the PyTorch DQN tutorial paged
LossDivergence, critical, on a healthy run). Real monitors, the real Gymnasium, frames to a
real engine."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from sentinel.instrument.options import from_kwargs
from sentinel.instrument.reporter import RL_MODULES
from tests.helpers import MLP, make_monitor


def _train(rl: bool | None, log: bool) -> tuple[list[dict], list[float], Any]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    said = {} if rl is None else {"rl": rl}  # None: not passed, as a script that says nothing
    mon, sender = make_monitor(model, opt, capture_loss=not log, **said)
    losses, gen = [], torch.Generator().manual_seed(0)
    try:
        for _ in range(4):
            x = torch.randn(8, 16, generator=gen)
            loss = torch.nn.functional.smooth_l1_loss(model(x), x.sum(dim=1, keepdim=True))
            losses.append(float(loss.detach()))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if log:
                mon.log(loss=loss)
    finally:
        mon.close()
    return sender.steps(), losses, sender.engine.store


@pytest.fixture
def gymnasium_imported() -> Iterator[None]:
    """The real Gymnasium imported, and every module of it gone again after the test: left
    in ``sys.modules``, it made every later monitor of the test process take its script for
    an agent's (``monkeypatch.setitem(sys.modules, "gymnasium", import_module(...))`` saved
    the module the import had just put there, and put it back)."""
    before = set(sys.modules)
    importlib.import_module("gymnasium")
    yield
    for name in set(sys.modules) - before:
        if name.partition(".")[0] in RL_MODULES:
            del sys.modules[name]


@pytest.mark.usefixtures("gymnasium_imported")
@pytest.mark.parametrize("log", [False, True], ids=["captured", "logged"])
def test_a_script_that_imported_gymnasium_records_its_loss_as_the_objective(
        log: bool) -> None:
    frames, losses, store = _train(None, log)
    assert [f["scalars"]["objective"] for f in frames] == pytest.approx(losses)
    assert all("loss" not in f["scalars"] for f in frames)
    assert not store.labelsets("sentinel_loss")
    # said otherwise: a supervised model trained beside an environment library keeps its loss
    frames, losses, store = _train(False, log)
    assert [f["scalars"]["loss"] for f in frames] == pytest.approx(losses)
    assert store.labelsets("sentinel_loss")


@pytest.mark.parametrize("name", [n for n in RL_MODULES if n != "gymnasium"])
def test_each_environment_library_named_makes_a_run_an_agents(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The other libraries are not installed here (old gym needs an old numpy): a module
    object of that name in ``sys.modules`` is what the check reads, so one stands in."""
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    frames, losses, _ = _train(None, False)
    assert [f["scalars"]["objective"] for f in frames] == pytest.approx(losses)


def test_sentinel_rl_1_as_the_readme_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment written by hand, and ``SENTINEL_RL=1`` in the environment (as under
    ``sentinel run``): the monitor's options come from it."""
    for name in RL_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setenv("SENTINEL_RL", "1")
    frames, losses, store = _train(None, True)
    assert [f["scalars"]["objective"] for f in frames] == pytest.approx(losses)
    assert not store.labelsets("sentinel_loss")


def test_without_an_environment_library_a_loss_is_a_loss_unless_said(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in RL_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    frames, losses, _ = _train(None, False)
    assert [f["scalars"]["loss"] for f in frames] == pytest.approx(losses)
    frames, losses, _ = _train(True, False)  # an environment written by hand (CleanRL-style scripts' own)
    assert [f["scalars"]["objective"] for f in frames] == pytest.approx(losses)


@pytest.mark.parametrize(("env", "want"), [("1", True), ("yes", True), ("0", False), ("false", False),
                                           ("auto", None)])
def test_sentinel_rl_says_it(monkeypatch: pytest.MonkeyPatch, env: str, want: bool | None) -> None:
    monkeypatch.setenv("SENTINEL_RL", env)
    assert from_kwargs({}).rl is want
    assert from_kwargs({"rl": False}).rl is False  # an explicit argument over the environment


def test_a_bad_sentinel_rl_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENTINEL_RL", "maybe")
    with pytest.raises(ValueError, match="rl: must be 1, 0 or auto"):
        from_kwargs({})
