"""Weights the script sets itself between steps (sentinel/instrument/rewrites.py):
``load_state_dict`` into a watched model and a ``torch.nn.utils.prune`` mask. The next
step's frame says so (``rewrite``), and the engine restarts the loss's baselines there as
at a warm restart (tests/programs/lottery.py: a lottery ticket's rewind to the initial
weights paged LossDivergence, critical). A module no monitor watches (a DQN's target
network) is no rewrite, nor is a checkpoint loaded before the first step. Real monitors,
real torch, frames to a real engine."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import prune

from tests.helpers import MLP, make_monitor


def _steps(model: nn.Module, opt: torch.optim.Optimizer, n: int, gen: torch.Generator) -> None:
    for _ in range(n):
        x = torch.randn(8, 16, generator=gen)
        loss = F.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()


def _rewrites(between: Callable[[nn.Module], Any], before: Callable[[nn.Module], Any] | None = None) -> list[Any]:
    """The ``rewrite`` of each of 5 step frames, with ``between(model)`` after step 3."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if before is not None:
        before(model)
    mon, sender = make_monitor(model, opt, capture_loss=True)
    gen = torch.Generator().manual_seed(0)
    try:
        _steps(model, opt, 3, gen)
        between(model)
        _steps(model, opt, 2, gen)
    finally:
        mon.close()
    frames = sender.steps()
    assert [f["step"] for f in frames] == [1, 2, 3, 4, 5]
    return [f.get("rewrite") for f in frames]


def test_load_state_dict_into_the_watched_model_is_said_at_the_next_step() -> None:
    saved: dict[str, Any] = {}

    def rewind(model: nn.Module) -> None:
        model.load_state_dict(saved["init"])

    assert _rewrites(rewind, lambda m: saved.update(init=copy.deepcopy(m.state_dict()))) == [
        None, None, None, "load_state_dict", None]


def test_a_pruning_mask_is_said_at_the_next_step() -> None:
    def prune_head(model: nn.Module) -> None:
        prune.l1_unstructured(model.head, "weight", amount=0.3)

    assert _rewrites(prune_head) == [None, None, None, "prune", None]

    def prune_all(model: nn.Module) -> None:  # the pruning tutorial's global pruning
        prune.global_unstructured([(m, "weight") for m in model.modules() if isinstance(m, nn.Linear)],
                                  pruning_method=prune.L1Unstructured, amount=0.2)

    assert _rewrites(prune_all) == [None, None, None, "prune", None]


def test_a_module_no_monitor_watches_and_a_checkpoint_before_the_first_step_are_no_rewrite() -> None:
    target = MLP()  # a DQN's target network, loaded from the policy every step

    def sync(model: nn.Module) -> None:
        target.load_state_dict(model.state_dict())

    assert _rewrites(sync) == [None] * 5
    resumed = MLP().state_dict()
    assert _rewrites(lambda model: None, lambda model: model.load_state_dict(resumed)) == [None] * 5


def test_load_state_dict_returns_and_raises_as_torch_does() -> None:
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon, _ = make_monitor(model, opt)
    try:
        _steps(model, opt, 2, torch.Generator().manual_seed(0))
        out = model.load_state_dict({"weight": torch.zeros(1, 16)}, strict=False)
        assert out.missing_keys == ["bias"] and out.unexpected_keys == []
        assert torch.equal(model.weight, torch.zeros(1, 16))
        with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"bias\""):
            model.load_state_dict({"weight": torch.ones(1, 16)})
    finally:
        mon.close()


def _lottery(rewind: Callable[[nn.Module, dict[str, Any]], None]) -> set[str]:
    """A lottery ticket's two rounds: a classifier trained to a low loss, its weights
    rewound to their initial values, trained again. The alerts that fired."""
    torch.manual_seed(0)
    x_all = torch.randn(2048, 16)
    y_all = (x_all @ torch.randn(16, 4)).argmax(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    init = copy.deepcopy(model.state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    mon, sender = make_monitor(model, opt, capture_loss=True)
    gen = torch.Generator().manual_seed(0)
    try:
        for round_ in range(2):
            if round_:
                rewind(model, init)
            for _ in range(400):
                idx = torch.randint(0, 2048, (64,), generator=gen)
                loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
    finally:
        mon.close()
    return {t.alertname for t in sender.engine.transitions if t.state_to == "firing"}


def test_a_lottery_tickets_rewind_pages_no_loss_rule() -> None:
    fired = _lottery(lambda model, init: model.load_state_dict(init))
    assert not fired & {"LossDivergence", "LossRising", "LossSpike", "LossOscillation"}, fired
    # the same rewind through .data, which no wrapper sees: the loss's jump back to its
    # start is judged against the first round's best level
    fired = _lottery(lambda model, init: [p.data.copy_(init[n]) for n, p in model.named_parameters()])
    assert "LossDivergence" in fired
