"""Schedule-aware rules: the engine's peak learning rate (engine/schedule.py), the
``scheduled`` detector, and UpdateRatioLow on frames of real torch schedulers."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.engine.schedule import SchedulePeaks
from sentinel.instrument import probes
from sentinel.rules.base import Context
from sentinel.rules.scheduled import ScheduledParams, detect
from sentinel.store import Window

NAN = math.nan


@pytest.mark.parametrize(
    ("reports", "fraction"),
    [
        ([[1e-3]] * 3, 1.0),  # constant, however low
        ([[1e-3], [5e-4], [1e-4]], 0.1),  # a gradual decay
        ([[1e-3], [1e-7]], 1.0),  # cut by hand 1e-4: a new start
        ([[1e-3], [1e-4]], 0.1),  # a 10× step (StepLR with gamma=0.1) is not a cut by hand
        ([[1e-3], [1e-4], [1e-5], [1e-6], [0.0]], 0.0),  # the end of a decay to zero restarts nothing
        ([[1e-3, 1e-3], [1e-3, 1e-5]], 1.0),  # the least-decayed group counts
    ],
)
def test_fraction_without_a_scheduler(reports: list[list[float]], fraction: float) -> None:
    sp = SchedulePeaks()
    for lrs in reports:
        out = sp.update("r", lrs)
    assert out == pytest.approx(fraction)


def test_a_schedulers_peak_counts_from_the_first_report() -> None:
    sp = SchedulePeaks()
    assert sp.update("r", [1e-6], [1e-3]) == pytest.approx(1e-3)  # a warmup's first step
    assert sp.update("r", [1e-9], [1e-3]) == pytest.approx(1e-6)  # a scheduler may cut fast


@pytest.mark.parametrize(
    ("value", "fraction", "fires"),
    [
        (1e-5, None, True),  # unknown fraction: judged as it is
        (1e-5, 1.0, True),  # too low from the start
        (1e-5, 0.05, False),  # 2e-4 at the peak lr: the schedule's doing
        (5e-6, 0.01, False),  # 5e-4 at the peak: the schedule's doing
        (1e-7, 0.01, True),  # 1e-5 at the peak: tiny beyond the schedule (vanishing grads)
        (1e-9, 1e-4, None),  # below min_fraction: no verdict
    ],
)
def test_scheduled_threshold(value: float, fraction: float | None, fires: bool | None) -> None:
    w = Window(np.array([10]), np.array([10.0]), np.array([value]))
    v = detect(w, ScheduledParams(op="<", value=1e-4), Context(step=10, now=0.0, lr_fraction=fraction))
    assert (None if v is None else v.firing) is fires


def _frames(sched: str, steps: int, ratio_at_peak: float) -> list[bytes]:
    """Frames of a run whose update ratio follows a real torch scheduler's lr."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    s: Any
    if sched == "cosine":
        s = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    elif sched == "warmup":
        s = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1e-4, total_iters=steps)
    else:
        s = None
    out = []
    for step in range(1, steps + 1):
        lrs = probes.learning_rates([opt])
        f: dict[str, Any] = {"kind": "step", "job": "j", "run": sched, "rank": 0, "step": step, "t": float(step),
                             "groups": ["w"], "grad_sumsq": [1.0], "lr": lrs, "param_sumsq": [1.0],
                             "delta_sumsq": [(ratio_at_peak * lrs[0] / 0.1) ** 2]}
        peaks = probes.schedule_peaks([opt])
        if peaks is not None:
            f["lr_peak"] = peaks
        out.append(wire.encode(f))
        opt.step()
        if s is not None:
            s.step()
    return out


@pytest.mark.parametrize(
    ("sched", "ratio_at_peak", "fires"),
    [
        ("cosine", 3e-3, False),  # tiny at the end: the schedule's doing
        ("warmup", 3e-3, False),  # tiny at the start of a torch warmup
        ("none", 3e-5, True),  # too low from the start
        ("cosine", 3e-5, True),  # too low at the peak already
    ],
)
def test_update_ratio_low_knows_the_schedule(sched: str, ratio_at_peak: float, fires: bool) -> None:
    eng = Engine()
    for data in _frames(sched, 300, ratio_at_peak):
        assert eng.feed(data)
    fired = {t.alertname for t in eng.transitions if t.state_to == "firing"}
    assert ("UpdateRatioLow" in fired) is fires, fired


def test_the_instrument_reports_the_schedulers_peak() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=0.1)
    assert probes.schedule_peaks([opt]) is None
    torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=10)
    assert probes.schedule_peaks([opt]) == [0.5]
    assert probes.learning_rates([opt])[0] < 0.05  # OneCycle starts at max_lr / 25
