"""``forecast``: memory is near its capacity, or its trend reaches capacity soon.

The capacity is the rule's ``reference`` metric (``sentinel_memory_capacity_bytes``: the
CUDA device total, or a configured limit), passed in as ``ctx.reference``.

The trend must be a steady climb, not a step: the window is cut into ``segments`` equal
parts whose medians must rise strictly from each part to the next. A jump (the first
optimizer step allocating Adam's state, a bigger batch) moves at most one part's median
between the levels on either side, so with six parts up to three jumps never look like a
trend; a leak raises every part. The slope is the rise between the first and last parts'
medians over the time between their middles.

A trend is extrapolated at most ``max_extrapolation`` times its own size: the remaining
headroom must be within that many times the rise seen across the window. Without this, a
fast-stepping run turns a small creep (allocator and interpreter warm-up on a real CPU run:
+10 MiB, 3 % of usage, over a few seconds) into "full in two minutes" against a capacity
36× that rise away; a steady leak is seen long before (a rise of 1/12 of the headroom per
window, as in the engine tests, still fires).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from sentinel.store import Window
from sentinel.rules.base import Context, Params, Verdict, median, since


class ForecastParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        ratio: fire when the latest value is at least this fraction of capacity.
        horizon_seconds: fire when the trend reaches capacity within this time.
        window: samples the trend is measured over.
        min_samples: fewer samples (since warm-up) give no forecast.
        min_ratio: forecasts count only once usage is above this fraction, so a small
            job's early growth is not extrapolated.
        segments: parts of the window whose medians must rise strictly.
        max_extrapolation: forecast only while the headroom left is at most this many
            times the rise across the window (first to last part).
    """

    ratio: float = Field(default=0.9, gt=0.0, le=1.0)
    horizon_seconds: float = Field(default=1800.0, gt=0.0)
    window: int = Field(default=60, ge=6)
    min_samples: int = Field(default=12, ge=6)
    min_ratio: float = Field(default=0.5, ge=0.0, le=1.0)
    segments: int = Field(default=6, ge=4)
    max_extrapolation: float = Field(default=20.0, gt=0.0)

    @model_validator(mode="after")
    def _fits(self) -> ForecastParams:
        if self.min_samples < 2 * self.segments or self.min_samples > self.window:
            raise ValueError("min_samples must be between 2 × segments and window")
        return self

    def samples(self) -> int:
        return self.window


def detect(window: Window, params: ForecastParams, ctx: Context) -> Verdict | None:
    """Fire on usage ≥ ``ratio`` of capacity, or a rising trend full within the horizon.

    Returns:
        None without a positive capacity or samples. The verdict's value is the latest
        usage as a fraction of capacity; its threshold is ``ratio``.
    """
    cap = ctx.reference
    if cap is None or not cap > 0.0 or len(window) == 0:
        return None
    last = float(window.values[-1])
    frac = last / cap
    if frac >= params.ratio:
        return Verdict(True, frac, params.ratio, baseline=cap, detail=f"{frac:.0%} of capacity")
    w = since(window, ctx.since_step)
    if len(w) < params.min_samples or frac < params.min_ratio:
        return Verdict(False, frac, params.ratio, baseline=cap)
    k = params.segments
    size = len(w) // k
    vals, times = w.values.tolist()[-size * k :], w.times.tolist()[-size * k :]
    levels = [median(vals[i * size : (i + 1) * size]) for i in range(k)]
    if any(b <= a for a, b in zip(levels, levels[1:])):
        return Verdict(False, frac, params.ratio, baseline=cap)
    t1, t3 = median(times[:size]), median(times[-size:])
    m1, m3 = levels[0], levels[-1]
    if t3 <= t1:
        return Verdict(False, frac, params.ratio, baseline=cap)
    slope = (m3 - m1) / (t3 - t1)
    eta = (cap - last) / slope
    firing = eta <= params.horizon_seconds and cap - last <= params.max_extrapolation * (m3 - m1)
    return Verdict(firing, frac, params.ratio, baseline=cap, detail=f"full in ~{eta:.0f} s")
