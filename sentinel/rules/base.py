"""What every detector shares: the verdict, the evaluation context and small statistics.

A detector is a pure function ``(window, params, ctx) -> Verdict | None``. It reads the
recent samples of one series and says whether the rule's condition holds *now*. It keeps
no state: "for K steps", hysteresis, grouping and cooldowns live in
:mod:`sentinel.rules.lifecycle`.

The statistics below work on Python lists on purpose: for the 20–500 samples a detector
looks at, ``sorted(list)`` is several times faster than ``numpy.median``, and the rule
engine runs on every ingested frame.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from sentinel.store import Window

_EMPTY: Mapping[str, Any] = {}


@dataclass(frozen=True, slots=True)
class Verdict:
    """A detector's answer for the latest sample of one series.

    Attributes:
        firing: the rule's condition holds at this sample.
        value: the observed quantity, in the unit the rule's summary prints.
        threshold: the level the value is compared against (for baseline detectors:
            the level derived from the baseline, e.g. ``factor × median``).
        baseline: the reference level, where the detector has one.
        detail: a short phrase for the summary's ``{detail}`` field.
        groups: groups named by the detector itself (e.g. the first non-finite groups).
    """

    firing: bool
    value: float
    threshold: float
    baseline: float | None = None
    detail: str = ""
    groups: tuple[str, ...] = ()


@dataclass(slots=True)
class Context:
    """What a detector may know besides its window. Detectors must not modify it.

    (Not frozen only because frozen dataclasses cost ~1 µs more to build, and the rule
    engine builds one per rule evaluation.)

    Attributes:
        step: the step being evaluated.
        now: wall-clock seconds at evaluation (the frame time, or the tick time).
        since_step: baselines use only samples at or after this step: the end of the
            rule's warm-up, or the last learning-rate change, whichever is later.
        reference: the latest value of the rule's ``reference`` metric (e.g. memory
            capacity), or None.
        reference_window: the latest samples of the ``reference`` metric, for a detector
            whose parameters ask for them (:meth:`Params.reference_samples`), else None.
        series: the labels of the evaluated series beyond job/run/rank (e.g. ``source``).
        nonfinite_groups: ``{source: [group, ...]}`` as passed by the engine.
        amp_skipped: the AMP scaler skipped a step since the previous frame of this rank.
        guard_skipped: the step guard kept this step out of the weights (its note said so).
        note: a phrase the engine attaches to this evaluation (e.g. a dead rank's last
            values), for detectors that print it.
        memo: a per-series dict a detector with a ``quiet`` shortcut, or one whose spec
            asks for it, may leave notes in (see :class:`DetectorSpec`); None when the
            engine keeps none.
        lr_fraction: the rank's learning rate over its peak (the highest it reported, or
            its scheduler's initial/max lr; the largest over param groups), None when
            unknown: how far a schedule has taken the lr (sentinel/engine/schedule.py).
        lr_change_step: the last step at which the learning rate changed by more than
            the engine's factor, or None (for detectors that judge what followed it).
        rewrite_step: the last step at which the script had set the weights itself (a
            checkpoint restored: a tuner's trials undone before the fit; a rewind), or None.
        loss_start: the level the rank's loss began at: the median of its first 3 finite
            values since its training began or the script last set its weights; None
            before the third (and for the time-based rules).
        heartbeat: for the time-based rules, the Unix time of the last heartbeat of any
            rank of the run (it evaluated between steps), or None.
        sibling_step: for the time-based rules, the Unix time of the latest step of
            another stream of the same process (another optimizer of the rank), or None.
        where: for the time-based rules, where the stream's training thread was when it
            last said so, after its last step (the frame's ``where``), or None.
    """

    step: int
    now: float
    since_step: int = 0
    reference: float | None = None
    reference_window: Window | None = None
    series: Mapping[str, str] = field(default_factory=dict)
    nonfinite_groups: Mapping[str, Sequence[str]] = field(default_factory=dict)
    amp_skipped: bool = False
    guard_skipped: bool = False
    note: str = ""
    memo: dict[str, Any] | None = None
    lr_fraction: float | None = None
    rewrite_step: int | None = None
    loss_start: float | None = None
    lr_change_step: int | None = None
    heartbeat: float | None = None
    sibling_step: float | None = None
    where: str | None = None


class Params(BaseModel):
    """Base of every detector's parameter model; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def samples(self) -> int:
        """How many of the latest samples the detector needs in its window."""
        return 1

    def reference_samples(self) -> int:
        """How many of the latest samples of the rule's ``reference`` metric the detector
        reads (``ctx.reference_window``); 0: none."""
        return 0


Detector = Callable[[Window, Any, Context], Verdict | None]


@dataclass(frozen=True)
class DetectorSpec:
    """A registry entry: the pure function, its parameter model, and when it runs.

    Attributes:
        fn: the detector.
        params: its parameter model.
        time_based: evaluated on ``tick(now)`` rather than on each ingested step.
        idle: optional shortcut ``(latest value, params) -> bool``; True promises that
            ``fn`` would not fire on any window ending in that value. While a rule has
            no open alert only firing verdicts matter, so the engine then skips reading
            the window at all.
        quiet: like ``idle``, with what ``fn`` left in ``ctx.memo`` at its last full
            evaluation of the series: ``(latest value, params, memo, samples appended to
            the series since) -> bool``. True promises ``fn`` would not fire now.
        memo: ``fn`` keeps notes of its own in ``ctx.memo`` from one full evaluation of
            a series to the next, without a ``quiet`` shortcut (one with it always has
            a memo).
    """

    fn: Detector
    params: type[Params]
    time_based: bool = False
    idle: Callable[[float, Any], bool] | None = None
    quiet: Callable[[float, Any, dict[str, Any], int], bool] | None = None
    memo: bool = False


def since(window: Window, step: int) -> Window:
    """The samples of ``window`` taken at or after ``step`` (all of them when step ≤ 0)."""
    if step <= 0 or len(window) == 0 or window.steps[0] >= step:
        return window
    i = int(np.searchsorted(window.steps, step, side="left"))
    return Window(window.steps[i:], window.times[i:], window.values[i:])


def quantile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty sequence."""
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence (sorted here)."""
    return quantile(sorted(values), 0.5)


def row_medians(rows: np.ndarray) -> np.ndarray:
    """Each row's median: one sort per row (``np.median``'s overhead is several times more,
    and the chunk medians of the level rules are taken at every judgement)."""
    ordered = np.sort(rows, axis=1)
    c = rows.shape[1]
    return np.asarray(0.5 * (ordered[:, (c - 1) // 2] + ordered[:, c // 2]))


def finite(values: Sequence[float]) -> list[float]:
    """The finite values, in order."""
    return [v for v in values if math.isfinite(v)]


def log_trend(steps: Sequence[float], values: Sequence[float]) -> tuple[float, float] | None:
    """The least-squares slope of log(value) per step and its standard error (values > 0);
    None when the steps do not spread."""
    x = np.asarray(steps, dtype=np.float64)
    y = np.log(np.asarray(values, dtype=np.float64))
    xc = x - x.mean()
    sxx = float(xc @ xc)
    if sxx <= 0:
        return None
    slope = float(xc @ (y - y.mean())) / sxx
    resid = y - y.mean() - slope * xc
    return slope, math.sqrt(max(float(resid @ resid), 1e-300) / max(1, len(x) - 2) / sxx)
