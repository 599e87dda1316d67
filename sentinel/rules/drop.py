"""``drop``: the latest value fell ``factor`` times below the window's peak, or below a floor.

Built for the AMP loss scale. ``GradScaler`` halves the scale on every overflow and
doubles it after ``growth_interval`` clean steps, so one overflow is a drop of 2× and
normal; a scale that keeps halving without recovering (16× within the window by default)
means the fp16 range no longer fits the gradients. Samples before ``ctx.since_step`` or
``after_step`` (the scaler's own calibration in the first steps) are not part of the peak;
the floor applies from the first sample, so a run whose every step overflows from the
start (the scale halving towards zero) is seen before any warm-up ends.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from sentinel.rules.base import Context, Params, Verdict, since
from sentinel.store import Window


class DropParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        window: samples whose maximum is the peak.
        factor: fire when ``latest × factor ≤ peak``.
        floor: also fire when the latest value is below this (None: no floor).
        min_samples: fewer samples (since warm-up / lr change) give no verdict on the
            drop; the floor applies from the first sample.
        after_step: the drop is judged only on samples from this step on, like
            ``ctx.since_step`` (the rule's warm-up) but without delaying the floor.
    """

    window: int = Field(default=200, ge=2)
    factor: float = Field(default=16.0, gt=1.0)
    floor: float | None = None
    min_samples: int = Field(default=2, ge=1)
    after_step: int = Field(default=0, ge=0)

    def samples(self) -> int:
        return self.window


def detect(window: Window, params: DropParams, ctx: Context) -> Verdict | None:
    """Fire on a ``factor``-fold fall from the peak, or a value under ``floor``.

    Returns:
        None for an empty window or a non-finite latest value. The verdict's value is
        the latest sample, its baseline the peak, its threshold ``peak / factor``.
    """
    if len(window) == 0:
        return None
    last = float(window.values[-1])
    if not math.isfinite(last):
        return None
    below_floor = params.floor is not None and last < params.floor
    w = since(window, max(ctx.since_step, params.after_step))
    vals = w.values[np.isfinite(w.values)]
    if len(vals) < params.min_samples:
        if below_floor:
            return Verdict(True, last, params.floor or 0.0, detail=f"below {params.floor:g}")
        return None
    peak = float(vals.max())
    threshold = peak / params.factor
    dropped = last <= threshold
    fold = peak / last if last > 0 else math.inf
    detail = f"{fold:.3g}× below its recent peak {peak:g}"
    return Verdict(dropped or below_floor, last, threshold, baseline=peak, detail=detail)
