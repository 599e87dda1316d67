"""An optimizer that ascends (``maximize=True``, a log-likelihood or an ELBO maximized as
it is): the value ``backward()`` got rises as training goes well, so it is recorded as the
scalar ``objective``, and the loss rules, which read a rise as trouble, never judge it.
Real monitor, real optimizer, frames to a real engine."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import make_monitor


@pytest.mark.parametrize("maximize", [True, False])
def test_a_maximized_objective_is_recorded_as_the_objective_not_the_loss(maximize: bool) -> None:
    torch.manual_seed(0)
    mu = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.Adam([mu], lr=0.05, maximize=maximize)
    mon, sender = make_monitor(None, opt, capture_loss=True)
    target, values = torch.tensor([1.0, -2.0, 0.5, 3.0]), []
    try:
        for _ in range(20):
            ll = -((mu - target) ** 2).sum()  # a log-likelihood: maximized as it is, or its negation minimized
            value = ll if maximize else -ll
            values.append(float(value.detach()))
            opt.zero_grad()
            value.backward()
            opt.step()
    finally:
        mon.close()
    name, other = ("objective", "loss") if maximize else ("loss", "objective")
    frames = sender.steps()
    assert [f["scalars"][name] for f in frames] == pytest.approx(values)
    assert all(other not in f["scalars"] for f in frames)
    assert values[-1] > values[0] if maximize else values[-1] < values[0]  # it trained either way
    store = sender.engine.store
    names = {dict(ls).get("name") for ls in store.labelsets("sentinel_scalar")}
    assert ("objective" in names) is maximize and bool(store.labelsets("sentinel_loss")) is not maximize
