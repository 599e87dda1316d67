"""A scheduler's warm restart (SGDR's ``CosineAnnealingWarmRestarts``, a cosine with hard
restarts) takes the lr back to its peak in one step, and the loss climbs out of the minimum
it was kicked from: by design, so neither LossDivergence (critical) nor LossRising judges the
100 steps after it, and their baselines begin there. The same jump of the lr made by hand
(no scheduler) is judged as before, and a loss that keeps climbing after a restart still
fires. Frames of a real torch scheduler, a real engine (a classifier under SGDR paged
LossDivergence at its first restart: the loss went from 0.066 to 0.45 and back)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.engine.schedule import SchedulePeaks
from sentinel.instrument import probes

STARTS = [1, 201, 601, 1401]  # CosineAnnealingWarmRestarts(T_0=200, T_mult=2): cycles of 200, 400, 800


def _loss(step: int, diverges: bool) -> float:
    c = max(i for i, s in enumerate(STARTS) if s <= step)
    k = step - STARTS[c]
    if c == 0:
        return 1.0 * math.exp(-k / 60) + 0.05
    if diverges:  # after the first restart the loss only climbs
        return 0.09 * (1 + (step - STARTS[1]) / 20)
    if k < 50:  # climbing out of the minimum, from its level there to 0.45
        low = _loss(STARTS[c] - 1, diverges)
        return low + (0.45 - low) * k / 50
    return 0.41 * math.exp(-(k - 50) / 40) + 0.04


def _frames(scheduled: bool, diverges: bool) -> list[bytes]:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=200, T_mult=2)
    rng = np.random.default_rng(0)
    out = []
    for step in range(1, STARTS[-1]):
        f: dict[str, Any] = {"kind": "step", "job": "j", "run": f"sgdr-{scheduled}-{diverges}", "rank": 0,
                             "step": step, "t": float(step), "groups": ["w"], "grad_sumsq": [1.0],
                             "lr": probes.learning_rates([opt]),
                             "scalars": {"loss": _loss(step, diverges) * float(rng.uniform(0.95, 1.05))}}
        peaks = probes.schedule_peaks([opt])
        if scheduled and peaks is not None:
            f["lr_peak"] = peaks  # what the instrument sends for a group with a torch scheduler
        out.append(wire.encode(f))
        opt.step()
        sched.step()
    return out


def _fired(frames: list[bytes]) -> set[str]:
    eng = Engine()
    for data in frames:
        assert eng.feed(data)
    return {t.alertname for t in eng.transitions if t.state_to == "firing"}


@pytest.mark.parametrize(("scheduled", "diverges", "fires"), [
    (True, False, False),  # SGDR's restart: the climb is the schedule's design
    (False, False, True),  # the same lr raised by hand: a divergence, as before
    (True, True, True),  # a restart after which the loss never comes down: judged after the grace
])
def test_a_warm_restarts_climb_is_no_divergence(scheduled: bool, diverges: bool, fires: bool) -> None:
    fired = _fired(_frames(scheduled, diverges))
    assert ("LossDivergence" in fired) is fires, fired
    if not fires:
        assert not fired & {"LossRising", "LossSpike", "EarlyLossRising"}, fired


def _restarts(make: Callable[[torch.optim.Optimizer], Any] | None, steps: int,
              by_hand: Callable[[int], float] | None = None) -> list[int]:
    """The steps at which the engine's schedule tracker sees a warm restart, fed what the
    instrument reports of a real torch scheduler (or of an lr set by hand)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    sched = make(opt) if make is not None else None
    sp, out = SchedulePeaks(), []
    for step in range(1, steps + 1):
        if by_hand is not None:
            opt.param_groups[0]["lr"] = by_hand(step)
        sp.update("r", probes.learning_rates([opt]), probes.schedule_peaks([opt]))
        if sp.restarted:
            out.append(step)
        opt.step()
        if sched is not None:
            sched.step()
    return out


def _warmup_cosine(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=1e-3, total_iters=20),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=80)], milestones=[20])


@pytest.mark.parametrize(("make", "want"), [
    (lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=30), [31, 61, 91]),  # SGDR
    (lambda o: torch.optim.lr_scheduler.CyclicLR(o, base_lr=0.001, max_lr=0.1, step_size_up=10), [26, 46, 66, 86]),
    (lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=40), [61]),  # past its T_max it climbs again
    (_warmup_cosine, []),  # a warmup's climb, then a decay: no restart
    (lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=100), []),
    (lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=10, gamma=0.5), []),
], ids=["sgdr", "cyclic", "cosine-past-t_max", "warmup-cosine", "onecycle", "step"])
def test_which_schedules_restart(make: Callable[[torch.optim.Optimizer], Any], want: list[int]) -> None:
    assert _restarts(make, 100) == want


def test_an_lr_raised_by_hand_is_no_restart() -> None:
    """No scheduler: an lr cut to 1e-4 and raised back by hand is judged as any change."""
    assert _restarts(None, 60, by_hand=lambda step: 1e-5 if 20 <= step < 40 else 0.1) == []
