"""A module of the model replaced after the optimizer was made (``model.fc = nn.Linear(...)``
after ``SGD(model.parameters())``): the new head gets gradients nobody applies and the loss
still falls. Sentinel warns once, naming the parameters (``sentinel.instrument.replaced``);
a part frozen by leaving it out of the optimizer, a loose tensor the loss reaches and a
GAN's discriminator are not that."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from tests.helpers import make_monitor


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.fc = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


def _train(model: nn.Module, opts: list[torch.optim.Optimizer], steps: int = 5,
           extra: torch.Tensor | None = None) -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen)
        loss = model(x).pow(2).mean() + (extra.exp().sum() if extra is not None else 0)
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        for opt in opts:
            opt.step()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sentinel" and r.levelno >= logging.WARNING]


def test_a_head_replaced_after_the_optimizer_was_made_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.fc = nn.Linear(32, 10)  # the fine-tuning script's new head, after the optimizer
    mon, _ = make_monitor(model, opt)
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        _train(model, [opt], steps=2)
        assert _warnings(caplog) == []  # the monitor looks at its third step (docs/instrumenting.md)
        _train(model, [opt], steps=1)
        assert len(_warnings(caplog)) == 1
        _train(model, [opt], steps=9)
    mon.close()
    [line] = _warnings(caplog)
    assert line.startswith("sentinel: the optimizer steps 2 parameters that no module of the model holds and that "
                           "get no gradient, while the model's fc.weight, fc.bias get gradients that no optimizer "
                           "applies"), line
    assert "Make the optimizer after changing the model" in line


@pytest.mark.parametrize("shape", ["frozen by leaving it out", "a loose tensor the loss reaches",
                                   "the optimizer made after the new head"])
def test_what_is_no_replaced_module_is_not_warned_of(shape: str, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = Net()
    extra = None
    if shape == "frozen by leaving it out":  # the backbone gets gradients nobody applies, on purpose
        opt = torch.optim.SGD(model.fc.parameters(), lr=0.1)
    elif shape == "a loose tensor the loss reaches":  # SAC's log_alpha beside the model
        extra = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([*model.parameters(), extra], lr=0.1)
    else:
        model.fc = nn.Linear(32, 10)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon, _ = make_monitor(model, opt)
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        _train(model, [opt], steps=12, extra=extra)
    mon.close()
    assert _warnings(caplog) == []


def test_a_gans_discriminator_filled_by_the_generators_pass_is_not_warned_of(
        caplog: pytest.LogCaptureFixture) -> None:
    """The generator's monitor watches ``net_g``; the discriminator's gradients from the
    generator's pass belong to the discriminator's own optimizer."""
    torch.manual_seed(0)
    net_g, net_d = nn.Sequential(nn.Linear(4, 16)), nn.Sequential(nn.Linear(16, 1))
    opt_g = torch.optim.Adam(net_g.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(net_d.parameters(), lr=1e-3)
    mon_g, sender = make_monitor(net_g, opt_g)
    mon_d, _ = make_monitor(net_d, opt_d, sender)
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        for _ in range(6):
            opt_d.zero_grad()
            net_d(net_g(torch.randn(8, 4)).detach()).mean().backward()
            opt_d.step()
            opt_g.zero_grad()
            net_d(net_g(torch.randn(8, 4))).mean().neg().backward()
            opt_g.step()
    mon_g.close()
    mon_d.close()
    assert _warnings(caplog) == []
