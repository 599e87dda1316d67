"""The line zero-code mode says when no torch optimizer steps the parameters
(``auto.hand_line``): parameters updated by hand, or stepped by an optimizer of a library's
own that has no step hooks, named, with fastai's way to a watched torch optimizer.

fastai cannot be installed beside the CPU torch here (its torchvision pulls another torch),
so its optimizer is a class of fastai's shape under fastai's module name; the whole loop
under ``sentinel run`` is tests/integration/test_run_no_optimizer.py's."""

from __future__ import annotations

from typing import Any

import torch

from sentinel.instrument import auto


class _BaseOptimizer:
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [{"params": ps, **hp} for ps, hp in zip(self.param_lists, self.hypers)]


class Optimizer(_BaseOptimizer):  # fastai.optimizer.Optimizer's shape: param lists, hypers, step()
    def __init__(self, params: Any, **hypers: float) -> None:
        self.param_lists, self.hypers = [list(params)], [dict(hypers)]

    def step(self) -> None:
        for p in self.param_lists[0]:
            p.data.add_(p.grad, alpha=-self.hypers[0]["lr"])


Optimizer.__module__ = "fastai.optimizer"


class _Broken:  # a step() and param_groups that raise: no stepper, and nothing raised
    def step(self) -> None: ...

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        raise RuntimeError("not today")


def test_fastais_optimizer_is_named_with_the_way_to_a_watched_one() -> None:
    model = torch.nn.Linear(4, 1)
    broken = _Broken()
    opt = Optimizer(model.parameters(), lr=0.1)
    stepper = auto._foreign_stepper(model.weight)
    assert stepper == "fastai.optimizer.Optimizer"
    line = auto.hand_line(stepper, 64)
    assert line.startswith("sentinel: the parameters are stepped by fastai.optimizer.Optimizer, which is no "
                           "torch.optim.Optimizer and has no step hooks."), line
    assert "from backward() 64 on" in line and "by hand" not in line
    assert "opt_func=partial(OptimWrapper, opt=torch.optim.AdamW)" in line
    assert opt.param_lists and broken is not None  # held alive through the scan


def test_parameters_no_optimizer_steps_are_updated_by_hand() -> None:
    model = torch.nn.Linear(4, 1)
    other = torch.nn.Linear(4, 1)
    held = (Optimizer(other.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1))
    assert auto._foreign_stepper(model.weight) is None  # only a torch optimizer holds it
    line = auto.hand_line(None, 64)
    assert "no optimizer has stepped after 64 backward() calls: the parameters are updated by hand" in line
    assert "OptimWrapper" not in line and len(held) == 2


def test_another_librarys_optimizer_is_named_without_fastais_hint() -> None:
    model = torch.nn.Linear(4, 1)
    kind = type("Optimizer", (Optimizer,), {"__module__": "mylib.optim"})
    opt = kind(model.parameters(), lr=0.1)
    line = auto.hand_line(auto._foreign_stepper(model.bias), 64)
    assert "stepped by mylib.optim.Optimizer" in line and "OptimWrapper" not in line and opt.param_lists
