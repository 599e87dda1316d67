"""An optimizer's stand-in that is no ``torch.optim.Optimizer`` and scales the gradients in
its own ``step()`` before calling the inner optimizer's (apex's LARC, torchlars' LARS):
Sentinel reads the loss's gradients, at the stand-in's step (``sentinel/instrument/outerstep.py``)."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest
import torch
from torch import nn

from sentinel.instrument import outerstep, registry
from tests.helpers import MLP, make_monitor


class Scaling:
    """LARC's shape: ``.optim``, its ``param_groups`` shown as its own, and a ``step()``
    that scales each gradient to a fixed share of its weight's norm, then steps the SGD."""

    def __init__(self, optim: torch.optim.Optimizer, trust: float = 0.001) -> None:
        self.optim, self.trust = optim, trust

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optim.param_groups

    def zero_grad(self) -> None:
        self.optim.zero_grad()

    def step(self) -> None:
        with torch.no_grad():
            for group in self.optim.param_groups:
                for p in group["params"]:
                    if p.grad is not None and p.grad.norm() > 0:
                        p.grad.mul_(self.trust * p.norm() / p.grad.norm())
        self.optim.step()


class Trainer:
    """A training class with an ``.optimizer`` and a ``step()`` of its own that runs the
    forward, ``backward()`` and the optimizer's step: no stand-in."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        self.norms: list[float] = []

    def step(self) -> None:
        loss = self.model(torch.randn(16, 16)).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.norms.append(_norm(self.model))
        self.optimizer.step()


def _norm(model: nn.Module) -> float:
    return math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None))


def _grad_norms(frames: list[dict[str, Any]]) -> dict[int, float | None]:
    steps = [f for f in frames if f["kind"] == "step"]
    return {f["step"]: math.sqrt(sum(f["grad_sumsq"])) if "grad_sumsq" in f else None for f in steps}


def _train(model: nn.Module, opt: Any, steps: int) -> list[float]:
    norms = []
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(16, 16)).pow(2).mean().backward()
        norms.append(_norm(model))
        opt.step()
    return norms


def test_the_stand_ins_steps_report_the_losss_gradients() -> None:
    model = MLP()
    stand_in = Scaling(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9))
    assert registry.unwrap(stand_in) is stand_in.optim  # sentinel.watch(model, larc) watches its SGD
    mon, sender = make_monitor(model, registry.unwrap(stand_in))
    norms = _train(model, stand_in, 8)
    mon.close()
    got = _grad_norms(sender.frames)
    # found at its first step, whose gradients were scaled already: that one reports none
    assert got[1] is None
    for step in range(2, 9):
        assert got[step] == pytest.approx(norms[step - 1], rel=1e-5), (step, got[step], norms[step - 1])
    assert norms[-1] > 10 * 0.001 * math.sqrt(sum(float(p.detach().pow(2).sum()) for p in model.parameters()))


def test_a_followed_stand_in_pickles_without_sentinel_and_its_errors_reach_the_script() -> None:
    model = MLP()
    stand_in = Scaling(torch.optim.SGD(model.parameters(), lr=0.1))
    mon, _ = make_monitor(model, stand_in.optim)
    _train(model, stand_in, 2)
    assert hasattr(Scaling.__dict__["step"], "__wrapped__")  # followed: its class's step, not the object's
    assert b"sentinel" not in pickle.dumps(stand_in)
    stand_in.trust = "bad"  # type: ignore[assignment]  # the script's own bug, inside its step()
    with pytest.raises(TypeError):
        _train(model, stand_in, 1)
    stand_in.trust = 0.001
    _train(model, stand_in, 2)  # and on it goes
    mon.close()


def test_a_trainer_class_with_its_own_step_is_no_stand_in() -> None:
    model = MLP()
    trainer = Trainer(model)
    mon, sender = make_monitor(model, trainer.optimizer)
    for _ in range(5):
        trainer.step()
    mon.close()
    assert Trainer.step.__qualname__ == "Trainer.step" and not hasattr(Trainer.step, "__wrapped__")
    got = _grad_norms(sender.frames)
    assert [got[s] for s in range(1, 6)] == pytest.approx(trainer.norms, rel=1e-5)


def test_the_stop_action_halts_the_stand_ins_step_before_the_weights_change() -> None:
    """``actions.stop_on``: the next step raises ``TrainingHalted``, with a stand-in too."""
    from sentinel import TrainingHalted

    model = MLP()
    stand_in = Scaling(torch.optim.SGD(model.parameters(), lr=0.1))
    mon, _ = make_monitor(model, stand_in.optim)
    _train(model, stand_in, 2)
    mon.request_stop("TrainingNonFinite fired")
    model.zero_grad()
    model(torch.randn(16, 16)).pow(2).mean().backward()
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(TrainingHalted):
        stand_in.step()
    assert all(torch.equal(p.detach(), w) for p, w in zip(model.parameters(), weights))
    mon.close()


class Unscaling:
    """A mixed-precision stand-in's shape (DeepSpeed's ``FP16_Optimizer``): its ``step()``
    makes the gradients the optimizer is given (new tensors, here the loss's unscaled),
    so what the parameters held as it began is not what is applied."""

    def __init__(self, optimizer: torch.optim.Optimizer, scale: float = 1024.0) -> None:
        self.optimizer, self.scale = optimizer, scale
        self.applied: list[float] = []

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def step(self) -> None:
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        for p in params:
            p.grad = p.grad / self.scale
        self.applied.append(math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params)))
        self.optimizer.step()


def test_a_stand_in_that_makes_its_gradients_in_its_step_is_read_at_its_optimizers_step() -> None:
    model = MLP()
    stand_in = Unscaling(torch.optim.SGD(model.parameters(), lr=0.01))
    mon, sender = make_monitor(model, stand_in.optimizer)
    for _ in range(6):
        model.zero_grad()
        (model(torch.randn(16, 16)).pow(2).mean() * stand_in.scale).backward()
        stand_in.step()
    mon.close()
    got = _grad_norms(sender.frames)
    assert got[1] is None  # found at its first step
    assert [got[s] for s in range(2, 7)] == pytest.approx(stand_in.applied[1:], rel=1e-5)
    assert outerstep._followed[Unscaling] is False  # it read nothing ahead after its second step


class Master:
    """DeepSpeed's ``FP16_Optimizer`` in its bones: the optimizer holds fp32 master copies of
    the model's weights, whose gradients the stand-in's ``step()`` assigns from the model's
    (None until then: they were set to None after the last step)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.masters = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        self.optimizer = torch.optim.SGD(self.masters, lr=0.01)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def step(self) -> None:
        for m, p in zip(self.masters, self.model.parameters()):
            m.grad = p.grad.detach().clone()
        self.optimizer.step()
        for m, p in zip(self.masters, self.model.parameters()):
            m.grad = None
            p.data.copy_(m.data)


def test_a_stand_in_whose_gradients_come_in_its_step_is_no_step_without_gradients() -> None:
    model = MLP()
    stand_in = Master(model)
    mon, sender = make_monitor(None, stand_in.optimizer)
    for _ in range(25):
        model.zero_grad()
        model(torch.randn(16, 16)).pow(2).mean().backward()
        stand_in.step()
    mon.close()
    steps = [f for f in sender.frames if f["kind"] == "step"]
    assert len(steps) == 25 and not any("no_gradient" in f for f in steps), [f.get("no_gradient") for f in steps]
    assert all("grad_sumsq" in f and sum(f["grad_sumsq"]) > 0 for f in steps[1:])
