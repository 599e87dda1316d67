"""A model trained as ``torch.jit.script`` made it: older production code (and TorchScript's
own recipes) script the module first and train the ``RecursiveScriptModule``. It takes no
forward hook, so ``sentinel.watch`` failed whole ("register_forward_pre_hook is not
supported on ScriptModules", with a traceback on stderr) and the run went unmonitored."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import nn

import sentinel
from sentinel.instrument import monitor
from tests.helpers import CaptureSender

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


@pytest.fixture
def sender(monkeypatch: pytest.MonkeyPatch) -> CaptureSender:
    capture = CaptureSender()
    monkeypatch.setattr(monitor, "connect", lambda options: (capture, None, None))  # frames stay here
    return capture


def test_a_scripted_model_is_watched(sender: CaptureSender, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = torch.jit.script(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        mon = sentinel.watch(model, opt)
    assert mon.active and not caplog.text
    norms, losses = [], []
    for _ in range(5):
        x = torch.randn(16, 8)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
        opt.step()
        mon.log(loss=loss)
        losses.append(loss.item())
    mon.capture.arm({"steps": 2})  # an engine's capture request: nothing to hook, nothing raised
    with torch.no_grad():
        model(torch.randn(2, 8))
    mon.close()
    steps = sender.steps()
    assert [f["step"] for f in steps] == [1, 2, 3, 4, 5]
    assert [math.sqrt(math.fsum(f["grad_sumsq"])) for f in steps] == pytest.approx(norms, rel=1e-5)
    assert [f["scalars"]["loss"] for f in steps] == pytest.approx(losses, rel=1e-6)
    assert mon.boundary.errors == 0
