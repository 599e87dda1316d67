"""``LearningRateVanished``: a schedule that took the learning rate below a millionth of its
peak and keeps it there stops the training, while the rules on small updates and plateaus
stand down under a schedule's low learning rate. The classic cause: an epoch-based
scheduler stepped after every batch. A planned decay to 0 (cosine, linear) spends too
short a tail below the floor to fire. Real monitor, real engine."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from sentinel.rules.threshold import ThresholdParams, check
from tests.helpers import make_monitor

Scheduler = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


def _train(schedule: Scheduler, steps: int) -> tuple[list[tuple[str, str, int]], list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = schedule(optimizer)
    mon, sender = make_monitor(model, optimizer, capture_loss=True)
    lrs = []
    try:
        for _ in range(steps):
            x = torch.randn(32, 8)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()  # every batch
            lrs.append(optimizer.param_groups[0]["lr"])
    finally:
        mon.close()
    moves = [(t.alertname, t.state_to, t.step) for t in sender.engine.transitions  # type: ignore[attr-defined]
             if t.alertname == "LearningRateVanished"]
    return moves, lrs


def test_an_epoch_scheduler_stepped_every_batch_is_heard_of() -> None:
    moves, lrs = _train(lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=30, gamma=0.1), 400)
    assert lrs[209] < 1e-8 <= lrs[179]  # below a millionth of 0.01 from step 211 on
    assert moves[0] == ("LearningRateVanished", "firing", 310), moves  # 100 steps below, a tenth of the run


def test_a_planned_decay_to_zero_and_a_step_decay_stay_quiet() -> None:
    cosine, lrs = _train(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=3000, eta_min=0.0), 3000)
    assert min(lrs) < 1e-8  # its last steps are below a millionth of the peak
    steps, _ = _train(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[300, 600, 900], gamma=0.1),
                      1000)  # the ImageNet recipe's three tenfold cuts: 1e-3 of the peak at most
    assert cosine == [] and steps == []


def test_the_step_share_raises_the_threshold_with_the_run() -> None:
    p = ThresholdParams(op=">=", value=100.0, step_share=0.1)
    assert check(100.0, p, step=310).firing  # type: ignore[union-attr]
    late = check(150.0, p, step=2000)  # 150 steps of 2,000: the tail of a long decay
    assert late is not None and not late.firing and late.threshold == 200.0
