"""``GradientExplosion``'s absolute ceiling (a norm above 1000 for 5 steps) is for
optimizers whose update is the gradient times the learning rate. Adam divides each update
by the gradients' own running size: pytorch/examples' fast neural style weighs its losses
1e5 and 1e10, its gradient norm stays near 5e4 and its training is healthy, and the rule
warned for the whole run (``tests/programs/fast_style.py``). Real monitor, real engine."""

from __future__ import annotations

import pytest
import torch

from sentinel.rules.threshold import ThresholdParams, check
from tests.helpers import make_monitor


def _heavy(optimizer_of: type[torch.optim.Optimizer], lr: float, steps: int = 12) -> tuple[list[str], float]:
    """A regression whose loss is weighted 1e6 (a gradient norm near 1e6); the alerts that
    fired, and the stream's sentinel_optimizer_adaptive."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = optimizer_of(model.parameters(), lr=lr)
    mon, sender = make_monitor(model, optimizer, capture_loss=True)
    try:
        for _ in range(steps):
            x = torch.randn(32, 8)
            loss = 1e6 * torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        mon.close()
    store = sender.engine.store
    [labels] = store.labelsets("sentinel_optimizer_adaptive")
    last = store.last("sentinel_optimizer_adaptive", labels)
    assert last is not None
    assert min(store.window("sentinel_grad_norm", labels).values.tolist()) > 1000  # type: ignore[union-attr]
    fired = [t.alertname for t in sender.engine.transitions if t.state_to == "firing"]  # type: ignore[attr-defined]
    return fired, last[2]


@pytest.mark.parametrize("optimizer_of", [torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop,
                                          torch.optim.Adagrad])
def test_a_large_steady_norm_under_an_adaptive_optimizer_is_no_explosion(
        optimizer_of: type[torch.optim.Optimizer]) -> None:
    fired, adaptive = _heavy(optimizer_of, 1e-3)
    assert adaptive == 1.0
    assert "GradientExplosion" not in fired, fired


def test_the_same_norm_under_sgd_still_warns() -> None:
    fired, adaptive = _heavy(torch.optim.SGD, 1e-12)  # an lr that keeps the weights in place
    assert adaptive == 0.0
    assert "GradientExplosion" in fired, fired


def test_the_threshold_holds_only_where_the_reference_says_so() -> None:
    p = ThresholdParams(op=">", value=1000.0, unless_reference=1.0)
    assert check(5e4, p, None).firing  # type: ignore[union-attr]  # no record yet: the ceiling applies
    assert check(5e4, p, 0.0).firing  # type: ignore[union-attr]
    held = check(5e4, p, 1.0)
    assert held is not None and not held.firing and held.value == 5e4
    assert not check(10.0, p, 0.0).firing  # type: ignore[union-attr]
