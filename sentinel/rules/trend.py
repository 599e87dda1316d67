"""``trend``: the series has been rising steadily, well outside its own noise.

A loss that climbs over a dozen steps never jumps 3× in one step (no spike) and takes
long to reach twice its best level (no divergence), yet a schedule bug that multiplies
the learning rate by a few hundred does exactly that. This detector judges a *segment*
of recent samples:

- the level rose: the median of its last ``chunk`` samples is at least ``factor`` times
  the median of its first ``chunk`` (medians, so one bad batch at either end is not a
  rise);
- the rise is steady and well outside the noise: the least-squares slope of log(value)
  over the segment is at least ``z`` standard errors above zero (a flat noisy loss has
  |t| above 5 about once in a million windows; a climb of 1.3× over 40 noisy steps is
  t ≈ 10 and more).

The segment is the last ``window`` samples; right after a learning-rate change
(``ctx.lr_change_step``) it is the samples since ``chunk`` steps before the change, judged
from ``lr_min`` samples after it with ``lr_z``: a rise that starts as the rate jumped is
seen within a few steps, and the verdict names the change.

Cost: a median of ``chunk`` values at each end first; the regression (one numpy pass over
``window`` values) only when the level has risen. While no alert is open, :func:`quiet`
moves the last segment on by the new sample and takes the two medians, without reading
the window.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

from pydantic import Field, PositiveInt, model_validator

from sentinel.rules.base import Context, Params, Verdict, log_trend, median, since
from sentinel.store import Window


class TrendParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        window: samples of the segment (without a recent learning-rate change).
        chunk: samples per level at each end of the segment (medians).
        factor: the last level must be at least this many times the first.
        z: the slope's t-statistic (log scale) must be at least this.
        lr_min: after a learning-rate change: judged from this many samples after it.
        lr_z: the t-statistic needed after a learning-rate change.
    """

    window: int = Field(default=40, ge=6)
    chunk: PositiveInt = 5
    factor: float = Field(default=1.3, gt=1.0)
    z: float = Field(default=6.0, gt=0.0)
    lr_min: PositiveInt = 6
    lr_z: float = Field(default=4.0, gt=0.0)

    @model_validator(mode="after")
    def _fits(self) -> TrendParams:
        if 2 * self.chunk > self.window:
            raise ValueError("window must hold two chunks")
        return self

    def samples(self) -> int:
        return self.window + self.chunk


def quiet(value: float, params: TrendParams, memo: dict[str, Any], appended: int) -> bool:
    """True when :func:`detect` would find no rise at ``value``, judged from the segment it
    left in ``memo`` one sample ago, which it then moves on by that sample.

    :func:`detect` leaves one only where the next segment is the last one without its
    first sample, plus ``value``: no learning-rate change, a full window, steps rising
    and none before ``since_step``. The engine keeps it to that (the memo's ``since``,
    ``lr`` and ``step``: same baseline start, no lr change since, a later step)."""
    base = memo.get("base")
    if not base or appended != 1 or not (value > 0 and math.isfinite(value)):
        return False
    vals = base[1:]
    vals.append(value)
    if not median(vals[-params.chunk:]) < params.factor * median(vals[: params.chunk]):
        return False  # it rose: the full verdict decides
    memo["base"] = vals
    memo["count"] += 1
    return True


def _positive(vals: list[float]) -> bool:
    """Every value is positive and finite (a finite sum and a positive minimum say so at
    once; the sum overflows or is not finite only in rare cases, checked one by one)."""
    if min(vals) <= 0:
        return False
    return math.isfinite(sum(vals)) or all(v > 0 and math.isfinite(v) for v in vals)


def detect(window: Window, params: TrendParams, ctx: Context) -> Verdict | None:
    """Fire when the segment's level rose ``factor``× with a slope ``z`` errors above 0.

    Returns:
        None with too few positive finite samples. The value is the last level, the
        threshold ``factor ×`` the first level, the baseline the first level.
    """
    w = since(window, ctx.since_step)
    p = params
    lr = ctx.lr_change_step
    steps: list[int] | None = None  # taken from the window only where needed: most verdicts need none
    after_lr = False
    if lr is not None:
        steps = w.steps.tolist()
        after_lr = sum(1 for s in steps if s >= lr) <= p.window
    if after_lr:
        assert lr is not None and steps is not None
        i = next((j for j, s in enumerate(steps) if s >= lr), len(steps))
        if len(steps) - i < p.lr_min:
            after_lr = False  # too soon to judge the change; the plain window still is
        else:
            steps, vals = steps[max(0, i - p.chunk):], w.values[max(0, i - p.chunk):].tolist()
    if not after_lr:
        vals = w.values[-p.window:].tolist()
        if len(vals) < p.window:
            return None
    if len(vals) < 2 * p.chunk or not _positive(vals):
        return None
    first, last = median(vals[: p.chunk]), median(vals[-p.chunk :])
    threshold = p.factor * first
    if ctx.memo is not None and lr is None and len(window) == p.samples():
        steps = window.steps.tolist()  # the whole window: since() left it as it is
        if steps[0] >= ctx.since_step and all(a < b for a, b in pairwise(steps)):
            ctx.memo.update(base=vals, since=ctx.since_step, lr=None, step=steps[-1])  # for quiet()
        steps = steps[-p.window:]
    if last < threshold:  # the common case: no rise, no regression
        return Verdict(False, last, threshold, baseline=first)
    if steps is None:
        steps = w.steps[-p.window:].tolist()
    elif not after_lr:
        steps = steps[-p.window:]
    fit = log_trend(steps, vals)
    if fit is None:
        return None
    t = fit[0] / fit[1]
    top = max(range(len(vals)), key=vals.__getitem__)
    span = steps[-1] - steps[0]
    what = (f"rose {last / first:.3g}× in {span} steps since the learning rate changed at step {lr}"
            if after_lr else f"rose {last / first:.3g}× over the last {span} steps")
    detail = (f"{what}: from {vals[0]:.4g} at step {steps[0]} to {vals[-1]:.4g} at step {steps[-1]}, "
              f"highest {vals[top]:.4g} at step {steps[top]}; slope {t:.1f} standard errors above flat")
    return Verdict(t >= (p.lr_z if after_lr else p.z), last, threshold, baseline=first, detail=detail)
