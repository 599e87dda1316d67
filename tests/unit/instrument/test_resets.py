"""A loop that never resets its gradients (no ``zero_grad()``): each step applies the sum of
every gradient so far. ``sentinel.instrument.resets`` tells it from every way public loops
reset them, and the engine's ``GradientsNotReset`` names it at step 4, before the alerts
that blame the learning rate (docs/rules.md)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers import MLP, CaptureSender, make_monitor


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(i)
    x = torch.randn(8, 16, generator=gen)
    return x, x.sum(dim=1, keepdim=True)


def _loss(model: nn.Module, i: int, shift: torch.Tensor | None = None) -> torch.Tensor:
    x, y = _batch(i)
    return nn.functional.mse_loss(model(x if shift is None else x + shift), y)


def _plain(model: nn.Module, opt: torch.optim.Optimizer, i: int, reset: Callable[[], None] | None) -> None:
    if reset is not None:
        reset()
    _loss(model, i).backward()
    opt.step()


def _data_zero(model: nn.Module) -> None:
    for p in model.parameters():  # older scripts' reset: .data's version counter is not the gradient's
        if p.grad is not None:
            p.grad.data.zero_()


def _run(loop: str, steps: int = 8) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    mon, sender = make_monitor(model, opt)
    for i in range(steps):
        if loop == "no reset":
            _plain(model, opt, i, None)
        elif loop == "zero_grad()":
            _plain(model, opt, i, opt.zero_grad)
        elif loop == "zero_grad(set_to_none=False)":
            _plain(model, opt, i, lambda: opt.zero_grad(set_to_none=False))
        elif loop == "model.zero_grad()":
            _plain(model, opt, i, model.zero_grad)
        elif loop == "p.grad.data.zero_()":
            _plain(model, opt, i, lambda: _data_zero(model))
        elif loop == "zero_grad() after step()":
            _plain(model, opt, i, None)
            opt.zero_grad()
        elif loop.startswith("accumulation over 4"):
            for k in range(4):
                (_loss(model, 4 * i + k) / 4).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if loop.endswith("reset after each step"):
                opt.zero_grad(set_to_none=False)
        elif loop == "adversarial: attack passes, then a reset":
            shift = torch.zeros(8, 16, requires_grad=True)
            for _ in range(2):  # the attack's backward() fills the model's gradients too
                _loss(model, i, shift).backward()
                shift = (shift + 0.01 * shift.grad.sign()).detach().requires_grad_(True)  # type: ignore[union-attr]
            opt.zero_grad(set_to_none=False)
            _loss(model, i, shift.detach()).backward()
            opt.step()
        elif loop == "a closure that resets":
            def closure() -> torch.Tensor:
                opt.zero_grad()
                loss = _loss(model, i)
                loss.backward()
                return loss
            opt.step(closure)
        elif loop == "gradients from torch.autograd.grad, assigned":
            params = list(model.parameters())
            for p, g in zip(params, torch.autograd.grad(_loss(model, i), params)):
                p.grad = g
            opt.step()
        elif loop == "a meta-gradient set through .data, only other models' passes":
            task = copy.deepcopy(model)  # Reptile: a task's copy trains, the meta-model steps on the distance
            inner = torch.optim.SGD(task.parameters(), lr=1e-2)
            for k in range(2):
                inner.zero_grad()
                _loss(task, 2 * i + k).backward()
                inner.step()
            for p, t in zip(model.parameters(), task.parameters()):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.data.zero_()
                p.grad.data.add_(p.data - t.data)
            opt.step()
        elif loop == "reset once per epoch of 4 steps":
            if i % 4 == 0:
                opt.zero_grad()
            _plain(model, opt, i, None)
        mon.log(loss=torch.tensor(1.0))
    mon.close()
    return sender.steps()


@pytest.mark.parametrize("loop", ["zero_grad()", "zero_grad(set_to_none=False)", "model.zero_grad()",
                                  "p.grad.data.zero_()", "zero_grad() after step()",
                                  "accumulation over 4, reset after each step",
                                  "adversarial: attack passes, then a reset", "a closure that resets",
                                  "gradients from torch.autograd.grad, assigned",
                                  "a meta-gradient set through .data, only other models' passes"])
def test_a_loop_that_resets_its_gradients_is_never_counted(loop: str) -> None:
    steps = _run(loop)
    assert len(steps) == 8
    assert [f.get("not_reset") for f in steps] == [None] * 8, loop


def test_accumulation_with_no_reset_is_counted_too() -> None:
    """Four micro-batches a step, clipped, and no reset: the passes after a step's first
    add to the gradient it found, which is no reset."""
    assert [f.get("not_reset") for f in _run("accumulation over 4, never reset")] == [None, *range(1, 8)]


def test_a_loop_with_no_reset_is_counted_from_its_second_step_and_fires_at_its_fourth() -> None:
    steps = _run("no reset")
    assert [f.get("not_reset") for f in steps] == [None, 1, 2, 3, 4, 5, 6, 7]
    sender = CaptureSender()
    for f in steps:  # the frames again, through a real engine
        sender.engine.ingest(f)
    [alert] = [a for a in sender.engine.alerts_json() if a["alertname"] == "GradientsNotReset"]
    assert alert["severity"] == "critical" and alert["started_step"] == 4, alert
    assert "each of the last 3 steps began from the gradients of the step before (no zero_grad())" in alert["summary"]
    assert [a["alertname"] for a in sender.engine.alerts_json()] == ["GradientsNotReset"]  # nothing else yet


def test_a_reset_once_per_epoch_ends_the_run_and_the_next_epoch_counts_again() -> None:
    assert [f.get("not_reset") for f in _run("reset once per epoch of 4 steps")] == [None, 1, 2, 3, 0, 1, 2, 3]


def test_a_gan_whose_generator_pass_fills_the_discriminators_gradients_is_never_counted() -> None:
    """examples/dcgan's order: the discriminator's reset and two passes and step, then the
    generator's reset, its pass (through the discriminator: its gradients filled, not reset
    until its next step) and step. Two monitors, one per player."""
    torch.manual_seed(0)
    net_g, net_d = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16)), MLP()
    opt_g = torch.optim.Adam(net_g.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(net_d.parameters(), lr=1e-3)
    sender = CaptureSender()
    mon_d, _ = make_monitor(net_d, opt_d, sender)
    mon_g, _ = make_monitor(net_g, opt_g, sender)
    for i in range(8):
        x, _ = _batch(i)
        net_d.zero_grad()
        net_d(x).mean().neg().backward()
        fake = net_g(torch.randn(8, 4))
        net_d(fake.detach()).mean().backward()
        opt_d.step()
        net_g.zero_grad()
        net_d(fake).mean().neg().backward()
        opt_g.step()
    mon_d.close()
    mon_g.close()
    steps = sender.steps()
    assert len(steps) == 16 and all("not_reset" not in f for f in steps)
