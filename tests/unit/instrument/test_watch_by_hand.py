"""``sentinel.watch(model)`` with no optimizer: a loop whose parameters no torch optimizer
steps (updated by hand, or a Keras 3 model's own optimizer on the torch backend) is watched
as zero-code mode watches one: a step per ``backward()``, its loss taken from it, its
gradient norms read right after it. It was a ``TypeError`` (the optimizer was required),
while ``docs/instrumenting.md`` promised an inert monitor for "no optimizer at all"."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import sentinel
from sentinel.instrument import monitor, registry
from tests.helpers import MLP, CaptureSender


@pytest.fixture
def sender(monkeypatch: pytest.MonkeyPatch) -> CaptureSender:
    capture = CaptureSender()
    monkeypatch.setattr(monitor, "connect", lambda options: (capture, None, None))  # frames stay here
    return capture


def _sgd_by_hand(model: torch.nn.Module, steps: int, lr: float = 0.05) -> list[tuple[float, float]]:
    """``steps`` steps of plain SGD written out; each step's loss and gradient norm."""
    gen = torch.Generator().manual_seed(3)
    out = []
    for _ in range(steps):
        x = torch.randn(32, 16, generator=gen)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
            for p in model.parameters():
                p -= lr * p.grad
                p.grad = None
        out.append((loss.item(), norm.item()))
    return out


def test_watch_without_an_optimizer_reports_a_step_per_backward(sender: CaptureSender) -> None:
    torch.manual_seed(0)
    model = MLP()
    mon = sentinel.watch(model)
    try:
        assert mon.active
        ref = _sgd_by_hand(model, 6)
    finally:
        mon.close()
    steps = sender.steps()
    assert [f["step"] for f in steps] == [1, 2, 3, 4, 5, 6]
    assert steps[0]["groups"] == ["layers.0", "layers.1", "layers.2", "head"]
    for frame, (loss, norm) in zip(steps, ref):
        assert frame["scalars"]["loss"] == pytest.approx(loss, rel=1e-6)  # from backward(): no log() call
        assert math.sqrt(sum(frame["grad_sumsq"])) == pytest.approx(norm, rel=1e-5)
        assert frame["lr"] == [] and "delta_sumsq" not in frame  # no optimizer's figures


def test_a_second_watch_of_the_model_returns_the_first(sender: CaptureSender, caplog: Any) -> None:
    model = MLP()
    first = sentinel.watch(model)
    try:
        assert sentinel.watch(model) is first
        assert "already watched" in caplog.text
        assert first in registry.owners(model.parameters())
    finally:
        first.close()
    assert registry.owners(model.parameters()) == []  # closed: the model is free to be watched again


def test_a_model_with_nothing_to_train_gets_an_inert_monitor(sender: CaptureSender, caplog: Any) -> None:
    model = MLP().requires_grad_(False)
    mon = sentinel.watch(model)
    assert not mon.active and "no parameter that requires grad" in mon.reason
    assert "training continues unmonitored" in caplog.text


def test_a_model_whose_layers_are_in_a_plain_list_is_told_why_it_has_none(sender: CaptureSender, caplog: Any) -> None:
    """The PyTorch examples' Forward-Forward keeps its layers in a plain list (each with its own
    Adam), which nn.Module does not register: ``watch(net)`` finds no parameter, and says
    where they are and what to give it instead."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = [nn.Linear(4, 4), nn.Linear(4, 2)]

    mon = sentinel.watch(Net())
    assert not mon.active
    assert "attribute 'layers' is a plain list of 2 module(s) with parameters" in mon.reason
    assert "nn.ModuleList" in caplog.text and "give watch() the optimizers" in caplog.text
    assert "plain" not in sentinel.watch(MLP().requires_grad_(False)).reason
