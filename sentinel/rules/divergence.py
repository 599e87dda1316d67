"""``divergence``: the current level stays far above the best level reached.

The current level is the median of the last ``recent`` samples, so a single bad batch
does not count (that is a spike). The best level is the lowest median of consecutive
``chunk``-sample chunks before it, since warm-up or the last learning-rate change. A loss
that keeps climbing, or jumped and stayed up, ends up ``factor`` times its best level.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field, model_validator

from sentinel.rules.base import Context, Params, Verdict, median, since
from sentinel.store import Window


class DivergenceParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        window: samples considered (bounded by the store's capacity).
        recent: samples whose median is the current level.
        chunk: chunk size for the best level.
        factor: fire when current > best + (factor − 1)·|best|.
        min_samples: fewer samples than this (since warm-up / lr change) give no verdict.
        min_rise: the current level must also exceed the best by this absolute amount,
            so a loss resting at ~0 does not "double" on noise.
    """

    window: int = Field(default=400, ge=10)
    recent: int = Field(default=20, ge=1)
    chunk: int = Field(default=20, ge=1)
    factor: float = Field(default=2.0, gt=1.0)
    min_samples: int = Field(default=80, ge=2)
    min_rise: float = Field(default=1e-6, ge=0.0)

    @model_validator(mode="after")
    def _fits(self) -> DivergenceParams:
        if self.recent + self.chunk > self.min_samples:
            raise ValueError("min_samples must be at least recent + chunk")
        if self.min_samples > self.window:
            raise ValueError("min_samples must not exceed window")
        return self

    def samples(self) -> int:
        return self.window


def detect(window: Window, params: DivergenceParams, ctx: Context) -> Verdict | None:
    """Fire when the recent median is ``factor`` times the best chunk median before it.

    Returns:
        None with fewer than ``min_samples`` finite samples since ``ctx.since_step``.
        The verdict's value is the current level, its baseline the best level.
    """
    vals = since(window, ctx.since_step).values
    ok = np.isfinite(vals)
    if not ok.all():
        vals = vals[ok]
    if len(vals) < params.min_samples:
        return None
    current = median(vals[-params.recent :].tolist())
    older = vals[: -params.recent]
    c = params.chunk
    n = len(older) // c * c  # whole chunks, ending at the newest
    # chunk medians: sort each row once (np.median's per-call overhead is several times more)
    rows = np.sort(older[len(older) - n :].reshape(-1, c), axis=1)
    best = float((0.5 * (rows[:, (c - 1) // 2] + rows[:, c // 2])).min())
    threshold = best + max((params.factor - 1.0) * abs(best), params.min_rise)
    firing = current > threshold
    detail = f"{current / best:.3g}× the best level {best:.3g}" if best > 0 else ""
    return Verdict(firing, current, threshold, baseline=best, detail=detail)
