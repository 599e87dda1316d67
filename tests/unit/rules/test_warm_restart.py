"""A scheduler's warm restart (SGDR's ``CosineAnnealingWarmRestarts``, a cosine with hard
restarts) takes the lr back to its peak in one step, and the loss climbs out of the minimum
it was kicked from: by design, so neither LossDivergence (critical) nor LossRising judges the
100 steps after it, and their baselines begin there. The same jump of the lr made by hand
(no scheduler) is judged as before, and a loss that keeps climbing after a restart still
fires. Frames of a real torch scheduler, a real engine (a classifier under SGDR paged
LossDivergence at its first restart: the loss went from 0.066 to 0.45 and back)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.engine.ingest import warm_restart
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


@pytest.mark.parametrize(("prev", "lrs", "peaks", "restart"), [
    ([1e-4], [0.1], [0.1], True),  # SGDR: from the end of a cycle back to the peak
    ([1e-4], [0.1], [math.nan], False),  # no scheduler: raised by hand
    ([0.01], [0.015], [0.1], False),  # a warmup's step
    ([0.04], [0.1], [0.1], True),  # a restart of a cosine that ends at 40 % of its peak
    ([1e-4], [0.04], [0.1], False),  # up, but not to the peak (CyclicLR's climb is gradual anyway)
    ([1e-4, 0.1], [0.1, 0.1], [0.1, 0.1], True),  # any group
])
def test_what_is_a_warm_restart(prev: list[float], lrs: list[float], peaks: list[float], restart: bool) -> None:
    assert warm_restart(prev, lrs, peaks) is restart
