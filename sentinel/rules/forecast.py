"""``forecast``: memory is near its capacity, or its trend reaches capacity soon.

The capacity is the rule's ``reference`` metric (``sentinel_memory_capacity_bytes``: a
configured limit, else the process's cgroup limit or the machine's memory for host RSS,
the device total for CUDA), passed in as ``ctx.reference``.

The trend must be a steady climb, not a step: the window is cut into ``segments`` equal
parts whose levels must rise strictly from each part to the next. A jump (the first
optimizer step allocating Adam's state, a bigger batch) moves at most one part's level
between the levels on either side, so with six parts up to three jumps never look like a
trend; a leak raises every part. The slope is the rise between the first and last parts'
levels over the time (and the steps) between their middles.

``level: min`` takes each part's lowest value, the base that a sawtooth (caches filled and
emptied, a periodic evaluation) returns to; a leak raises the base too. With ``lookback``
the latest part must also reach above every value of the ``lookback`` samples before the
window: a sawtooth whose period is longer than a part climbs through the window like a
leak, but not above the peaks it reached before.

A trend is extrapolated at most ``max_extrapolation`` times its own size: the remaining
headroom must be within that many times the rise seen across the window. Without this, a
fast-stepping run turns a small creep (allocator and interpreter warm-up on a real CPU run:
+10 MiB, 3 % of usage, over a few seconds) into "full in two minutes" against a capacity
36× that rise away; a steady leak is seen long before (a rise of 1/12 of the headroom per
window, as in the engine tests, still fires).

Exhaustion is due when it is within ``horizon_seconds`` or ``horizon_steps`` (0: not
used) at the current pace; with ``min_ratio`` 0 that holds whatever the current use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, model_validator

from sentinel.rules.base import Context, Params, Verdict, median, since
from sentinel.store import Window


class ForecastParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        ratio: fire when the latest value is at least this fraction of capacity.
        horizon_seconds: fire when the trend reaches capacity within this time.
        horizon_steps: ... or within this many training steps (0: by time only).
        window: samples the trend is measured over.
        min_samples: fewer samples (since warm-up) give no forecast.
        min_ratio: forecasts count only once usage is above this fraction (0: always).
        segments: parts of the window whose levels must rise strictly.
        level: a part's level: its ``median``, or its ``min`` (the base a sawtooth
            returns to).
        lookback: samples before the window whose highest value the latest part must
            exceed (0: not checked).
        max_extrapolation: forecast only while the headroom left is at most this many
            times the rise across the window (first to last part).
    """

    ratio: float = Field(default=0.9, gt=0.0, le=1.0)
    horizon_seconds: float = Field(default=1800.0, gt=0.0)
    horizon_steps: NonNegativeInt = 0
    window: int = Field(default=60, ge=6)
    min_samples: int = Field(default=12, ge=6)
    min_ratio: float = Field(default=0.5, ge=0.0, le=1.0)
    segments: int = Field(default=6, ge=4)
    level: Literal["median", "min"] = "median"
    lookback: NonNegativeInt = 0
    max_extrapolation: float = Field(default=20.0, gt=0.0)

    @model_validator(mode="after")
    def _fits(self) -> ForecastParams:
        if self.min_samples < 2 * self.segments or self.min_samples > self.window:
            raise ValueError("min_samples must be between 2 × segments and window")
        return self

    def samples(self) -> int:
        return self.window + self.lookback


def _eta(seconds: float, steps: float) -> str:
    when = f"~{seconds / 60:.0f} min" if seconds >= 120 else f"~{seconds:.0f} s"
    return f"full in {when} (~{steps:.0f} steps) at the current pace"


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
    quiet = Verdict(False, frac, params.ratio, baseline=cap)
    n = min(len(w), params.window)
    if n < params.min_samples or frac < params.min_ratio:
        return quiet
    k = params.segments
    size = n // k
    vals, times = w.values.tolist()[-size * k :], w.times.tolist()[-size * k :]
    pick = min if params.level == "min" else median
    levels = [pick(vals[i * size : (i + 1) * size]) for i in range(k)]
    if any(b <= a for a, b in zip(levels, levels[1:])):
        return quiet
    if params.lookback:
        before = w.values.tolist()[: len(w) - size * k][-params.lookback :]
        if before and max(vals[-size:]) <= max(before):
            return quiet  # not above the peaks before the window: a sawtooth's climb
    steps = w.steps.tolist()[-size * k :]
    t1, t3 = median(times[:size]), median(times[-size:])
    s1, s3 = median(steps[:size]), median(steps[-size:])
    m1, m3 = levels[0], levels[-1]
    if t3 <= t1:
        return quiet
    rise = m3 - m1
    eta = (cap - last) / (rise / (t3 - t1))
    eta_steps = (cap - last) / (rise / (s3 - s1)) if s3 > s1 else float("inf")
    due = eta <= params.horizon_seconds or 0 < params.horizon_steps and eta_steps <= params.horizon_steps
    firing = due and cap - last <= params.max_extrapolation * rise
    detail = f"{frac:.0%} of {cap / 2**30:.3g} GiB, rising {rise / 2**20 / max(1.0, s3 - s1):.3g} MiB/step; " + _eta(eta, eta_steps)
    return Verdict(firing, frac, params.ratio, baseline=cap, detail=detail)
