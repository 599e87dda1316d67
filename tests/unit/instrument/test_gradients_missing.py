"""An optimizer that steps parameters no gradient reaches: the model built again after the
optimizer was made (a reload, a second call of the model factory), so that it steps the
old model's parameters while the loss uses the new one's. The gradient norm reads 0 and the
update ratio 0, which the vanishing-gradient and small-update rules ignore as frozen
parameters; ``GradientsMissing`` (critical) pages it at the 20th step in a row. Real
monitor, real engine."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.helpers import make_monitor


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _loss(model: nn.Module) -> torch.Tensor:
    x = torch.randn(32, 8)
    return (model(x) - x.sum(1, keepdim=True)).pow(2).mean()


def _runs(frames: list[dict[str, Any]]) -> dict[int, int]:
    return {f["step"]: f["no_gradient"] for f in frames if f["kind"] == "step" and "no_gradient" in f}


def _alerts(sender: Any, name: str) -> list[str]:
    return [t.state_to for t in sender.engine.transitions if t.alertname == name]


def test_an_optimizer_of_a_model_built_again_pages_at_the_20th_step() -> None:
    torch.manual_seed(0)
    model = _net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    watched = model
    model = _net()  # the bug
    mon, sender = make_monitor(watched, optimizer, capture_loss=True)
    for _ in range(25):
        loss = _loss(model)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # gradients reach the optimizer's parameters again (the old model back in the loss): it resolves
    for _ in range(3):
        loss = _loss(watched)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    mon.close()
    runs = _runs(sender.frames)
    assert [runs[s] for s in range(1, 26)] == list(range(1, 26)) and runs[26] == 0 and 27 not in runs, runs
    assert _alerts(sender, "GradientsMissing") == ["firing", "resolved"]
    [fired] = [t for t in sender.engine.transitions if t.alertname == "GradientsMissing" and t.state_to == "firing"]
    assert fired.severity == "critical" and fired.step == 20, fired
    assert "No gradient reached the parameters of rank 0's optimizer for 20 steps in a row" in fired.summary


def test_a_loop_that_steps_before_backward_pages_with_the_loops_order_among_the_causes() -> None:
    """``zero_grad()``, ``step()``, then ``backward()``: each step finds the gradients reset
    (None), so nothing trains; the causes name the order and the checks give the right one."""
    torch.manual_seed(0)
    model = _net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, optimizer, capture_loss=True)
    for _ in range(22):
        loss = _loss(model)
        optimizer.zero_grad()
        optimizer.step()  # the bug: before backward()
        loss.backward()
    mon.close()
    [fired] = [t for t in sender.engine.transitions if t.alertname == "GradientsMissing" and t.state_to == "firing"]
    assert fired.step == 20, fired
    assert any("step() before backward()" in c for c in fired.causes), fired.causes
    assert "Check the loop's order, which is zero_grad(), the forward, backward(), then step()" in fired.checks


def test_frozen_parameters_and_a_game_stepped_in_turn_are_not_counted() -> None:
    torch.manual_seed(0)
    frozen, trained = _net(), _net()
    frozen.requires_grad_(False)  # a frozen backbone whose optimizer is stepped all the same
    opt_frozen = torch.optim.SGD(frozen.parameters(), lr=0.1)
    opt_trained = torch.optim.SGD(trained.parameters(), lr=1e-2)
    mon_frozen, frozen_sender = make_monitor(frozen, opt_frozen)
    # a critic stepped every iteration and given its pass only every other one: at most 1 in a row
    mon, sender = make_monitor(trained, opt_trained, capture_loss=True)
    for i in range(30):
        opt_trained.zero_grad()
        if i % 2 == 0:
            _loss(trained).backward()
        opt_trained.step()
        opt_frozen.step()
    mon.close()
    mon_frozen.close()
    assert _runs(frozen_sender.frames) == {}
    assert set(_runs(sender.frames).values()) == {0, 1}
    assert _alerts(sender, "GradientsMissing") == [] and _alerts(frozen_sender, "GradientsMissing") == []
