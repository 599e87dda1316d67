"""``oscillation``: the loss swings around its trend by more than a fraction of its level.

The seeds' rule of thumb: swings within 10 % are acceptable, above 30 % point to a
learning rate that is too high, a batch that is too small or unshuffled data.

Amplitude here is the half-width of the central 90 % of the residuals once the trend is
removed: ``(p95 − p5) / 2``, relative to the level. The trend is a least-squares
polynomial (quadratic by default: a linear fit leaves the bend of a fast-falling loss as
"oscillation"). For a positive series it is fitted to ``log(loss)`` — an exponentially
falling loss is a straight line there — and the residual quantiles ``lo, hi`` are mapped
back as ``(e^hi − e^lo) / (e^hi + e^lo)``: a loss alternating between 1.3 and 0.7 has
amplitude 0.3. White noise with a relative standard deviation σ has amplitude ≈ 1.64 σ,
so ordinary SGD noise of 5–10 % reads 0.08–0.16.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field, model_validator

from sentinel.engine.store import Window
from sentinel.rules.base import Context, Params, Verdict, quantile, since


class OscillationParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        window: samples the amplitude is measured over.
        min_samples: fewer samples (since warm-up / lr change) give no verdict.
        amplitude: fire above this relative amplitude.
        log: detrend on a log scale when all samples are positive.
        degree: degree of the trend polynomial (1: linear, 2: quadratic).
        min_amplitude: the absolute half-width must also exceed this, so a loss
            resting near zero does not oscillate "relatively" on noise.
    """

    window: int = Field(default=100, ge=10)
    min_samples: int = Field(default=40, ge=10)
    amplitude: float = Field(default=0.3, gt=0.0)
    log: bool = True
    degree: int = Field(default=2, ge=1, le=2)
    min_amplitude: float = Field(default=0.0, ge=0.0)

    @model_validator(mode="after")
    def _fits(self) -> OscillationParams:
        if self.min_samples > self.window:
            raise ValueError("min_samples must not exceed window")
        return self

    def samples(self) -> int:
        return self.window


def _residuals(x: np.ndarray, y: np.ndarray, degree: int) -> np.ndarray:
    """``y`` minus its least-squares polynomial of ``degree`` (1 or 2) over ``x``.

    Solves the 2×2 or 3×3 normal equations directly: ``np.polyfit`` costs several times
    more for the ~100 samples used here.
    """
    span = float(x.max() - x.min())
    if span <= 0.0 or len(x) <= degree:
        return y - y.mean()
    u = (x - x.mean()) / span  # centred and scaled: well-conditioned for any step numbers
    cols = [np.ones_like(u), u] if degree == 1 else [np.ones_like(u), u, u * u]
    a = np.vstack(cols)
    coef = np.linalg.solve(a @ a.T, a @ y)
    return y - coef @ a


def amplitude(
    steps: np.ndarray, values: np.ndarray, log: bool = True, degree: int = 2
) -> tuple[float, float]:
    """``(relative amplitude, absolute half-width)`` of the detrended series.

    Args:
        steps: the x axis (step numbers).
        values: finite samples, same length as ``steps``, at least 2.
        log: detrend ``log(values)`` when all are positive.
        degree: degree of the trend polynomial.
    """
    x = steps.astype(np.float64)
    if log and float(values.min()) > 0.0:
        r = sorted(_residuals(x, np.log(values), degree).tolist())
        lo, hi = math.exp(quantile(r, 0.05)), math.exp(quantile(r, 0.95))
        rel = (hi - lo) / (hi + lo)  # half-range over the midpoint: 1.3 / 0.7 → 0.3
        level = math.exp(float(np.log(values).mean()))
        return rel, rel * level
    r = sorted(_residuals(x, values, degree).tolist())
    half = (quantile(r, 0.95) - quantile(r, 0.05)) / 2.0
    level = abs(float(values.mean()))
    return (half / level if level > 0 else math.inf), half


def detect(window: Window, params: OscillationParams, ctx: Context) -> Verdict | None:
    """Fire when the detrended relative amplitude over the window exceeds ``amplitude``.

    Returns:
        None with fewer than ``min_samples`` finite samples since ``ctx.since_step``.
        The verdict's value is the relative amplitude (0.3 = ±30 %).
    """
    w = since(window, ctx.since_step)
    ok = np.isfinite(w.values)
    if int(ok.sum()) < params.min_samples:
        return None
    steps, values = w.steps[ok], w.values[ok]
    rel, half = amplitude(steps, values, params.log, params.degree)
    firing = rel > params.amplitude and half > params.min_amplitude
    return Verdict(firing, rel, params.amplitude, detail=f"±{rel:.0%} around the trend")
