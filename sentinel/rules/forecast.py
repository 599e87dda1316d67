"""``forecast``: memory is near its capacity, or its trend reaches capacity soon.

The capacity is the rule's ``reference`` metric (``sentinel_memory_capacity_bytes``: the
CUDA device total, or a configured limit), passed in as ``ctx.reference``.

The trend must be a steady climb, not a step: the window is cut in thirds and their
medians must rise strictly from one third to the next. The first optimizer step
allocating Adam's state is one jump, which leaves two equal thirds and no forecast; a
leak raises all three. The slope is the rise between the first and last thirds' medians
over the time between their middles.
"""

from __future__ import annotations

from pydantic import Field

from sentinel.engine.store import Window
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
    """

    ratio: float = Field(0.9, gt=0.0, le=1.0)
    horizon_seconds: float = Field(1800.0, gt=0.0)
    window: int = Field(60, ge=6)
    min_samples: int = Field(12, ge=6)
    min_ratio: float = Field(0.5, ge=0.0, le=1.0)

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
    third = len(w) // 3
    vals, times = w.values.tolist(), w.times.tolist()
    m1, m2, m3 = (median(vals[i * third : (i + 1) * third]) for i in range(3))
    t1 = median(times[:third])
    t3 = median(times[2 * third : 3 * third])
    if not (m1 < m2 < m3) or t3 <= t1:
        return Verdict(False, frac, params.ratio, baseline=cap)
    slope = (m3 - m1) / (t3 - t1)
    eta = (cap - last) / slope
    firing = eta <= params.horizon_seconds
    return Verdict(firing, frac, params.ratio, baseline=cap, detail=f"full in ~{eta:.0f} s")
