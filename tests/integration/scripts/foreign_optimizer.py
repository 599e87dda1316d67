"""A loop stepped by an optimizer of a library's own, no ``torch.optim.Optimizer``: the shape
of fastai's ``Optimizer`` (its ``Learner``'s default), which cannot be installed beside the
CPU torch here (fastai needs torchvision, whose wheels pull another torch). Parameter lists
and hyper-parameters per group, ``param_groups`` as a property over them, a ``step()`` that
runs stepper functions, and a ``zero_grad()`` that zeroes the gradients in place rather than
setting them to None. Prints iteration and loss."""

from collections import defaultdict
from typing import Any

import torch
from torch import nn


class _BaseOptimizer:
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [{"params": ps, **hp} for ps, hp in zip(self.param_lists, self.hypers)]


class Optimizer(_BaseOptimizer):
    def __init__(self, params: Any, cbs: list[Any], **defaults: float) -> None:
        self.param_lists = [list(params)]
        self.hypers = [dict(defaults)]
        self.state: dict[Any, dict[str, Any]] = defaultdict(dict)
        self.cbs = cbs

    def zero_grad(self) -> None:
        for ps in self.param_lists:
            for p in ps:
                if p.grad is not None:
                    p.grad.detach_()
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for ps, hp in zip(self.param_lists, self.hypers):
            for p in ps:
                if p.grad is not None:
                    for cb in self.cbs:
                        self.state[p] = {**self.state[p], **(cb(p, **{**self.state[p], **hp}) or {})}


def average_grad(p: torch.Tensor, mom: float, grad_avg: torch.Tensor | None = None, **_: Any) -> dict[str, Any]:
    grad_avg = torch.zeros_like(p) if grad_avg is None else grad_avg
    return {"grad_avg": grad_avg.mul_(mom).add_(p.grad)}


def momentum_step(p: torch.Tensor, lr: float, grad_avg: torch.Tensor, **_: Any) -> None:
    p.add_(grad_avg, alpha=-lr)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
opt = Optimizer(model.parameters(), [average_grad, momentum_step], lr=0.01, mom=0.9)
for i in range(100):
    x = torch.randn(32, 4)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(i, f"{loss.item():.6f}")
