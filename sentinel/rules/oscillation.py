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

A large amplitude alone is not an oscillation: the per-batch loss of a small batch is a
noisy estimate, and its batch-to-batch noise is independent from one step to the next
(measured on real CPU runs with batches of 16: an MSE loss at its noise floor reads
0.5–0.6, a cross-entropy near zero up to 0.7, with no fault at all). Swings that come from
the training itself — a learning rate too high (a zig-zag), unshuffled data (blocks of
similar batches), a cycle — are correlated across consecutive steps. So the residuals must
also fail a whiteness test: the Ljung–Box statistic over lags ``1..lags``,
``Q = n(n+2) Σ ρ_k² / (n−k)``, must exceed ``q``. For white noise ``Q`` follows χ² with
``lags`` degrees of freedom (99.9 % below 20.5 for 5 lags); the clean runs above stayed
under 20, while unshuffled data and lr-induced zig-zags read 30–170.

While the loss falls (or climbs) fast, no polynomial follows it: a classifier's loss that
drops from 1.3 to 0.005 within the window leaves large, smooth residuals that look like
swings to both tests. So the rule does not fire while the level moves by more than
``max_trend`` (a factor) across the window — the median of its last third against the
median of its first third — *and* by more than twice the swings' half-width (log scale).
On real runs a classifier's fast fall read 3.6–11× its swings, while data sorted by label
(blocks of single-class batches) swung 0.02–2× more than its level moved.

"A fraction of its level" measures a swing only when 0 is the loss's floor. Many losses have
no such zero: PPO's clipped surrogate plus value loss minus an entropy bonus sits around 0
with either sign, a Gaussian VAE's negative ELBO falls through 0 as it fits. There a mean
near 0 made any noise a swing of thousands of percent (up to 166× the mean on the clean
PPO zoo run, tests/programs/ppo.py), so only the whiteness test stood between a healthy run
and an alert: that run's windows reached Q 29.6 against 30 (its rollouts of 16 minibatches
each have their own level), a synthetic run like it crossed 30 in 9 % of windows. So where
the window holds a value ≤ 0, the half-width is judged against ``max(|mean|, noise·σ)``, σ
the residuals' *innovation* noise: their standard deviation times ``√Π(1 − φ_kk²)``, the
part that the previous ``lags`` residuals do not predict (Levinson–Durbin on the
autocorrelations the whiteness test uses). Noise, white or correlated, is mostly
unpredictable, so its half-width reads ≈ 1.65 σ (at most 2.0 σ over 2,000 windows of white
noise and over the clean PPO and VAE runs); a swing that the training makes (a zig-zag,
blocks, a cycle) is predictable, so σ stays near the noise under it while the half-width
grows with the swing: a two-level zig-zag of ±3 noise σ reads 3.6 σ (median), of ±2 σ
2.9 σ. With ``amplitude`` 0.3 and ``noise`` 8 the bar is 2.4 σ.

The level guard has no factor there, only "more than twice the swings' half-width", the
level as the *means* of the first and last thirds (a third of a zig-zag has its median
anywhere between the two levels). A floor of ``max_trend`` times the scale above let a
VAE-like loss falling through 0 along an exponential (13 → −4, τ 10–20 steps) fire in
63–98 % of windows; without it, none did. A positive series keeps the ratio to its level.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field, model_validator

from sentinel.rules.base import Context, Params, Verdict, median, quantile, since
from sentinel.store import Window


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
        q: the residuals' Ljung–Box statistic must exceed this (0 disables the test),
            so independent batch-to-batch noise never counts as oscillation.
        lags: autocorrelation lags in that statistic.
        max_trend: never fire while the medians of the first and last thirds of the
            window differ by more than this factor and by more than twice the swings
            (a series with values ≤ 0: by more than twice the swings; 0 disables).
        noise: where the window holds a value ≤ 0 (a loss without a floor at 0), the
            amplitude is relative to ``max(|mean|, noise × σ)``, σ the residuals' noise
            that the previous ``lags`` residuals do not predict (0: to ``|mean|``).
    """

    window: int = Field(default=100, ge=10)
    min_samples: int = Field(default=40, ge=10)
    amplitude: float = Field(default=0.3, gt=0.0)
    log: bool = True
    degree: int = Field(default=2, ge=1, le=2)
    min_amplitude: float = Field(default=0.0, ge=0.0)
    q: float = Field(default=30.0, ge=0.0)
    lags: int = Field(default=5, ge=1, le=20)
    max_trend: float = Field(default=4.0, ge=0.0)
    noise: float = Field(default=8.0, ge=0.0)

    @model_validator(mode="after")
    def _fits(self) -> OscillationParams:
        if self.min_samples > self.window:
            raise ValueError("min_samples must not exceed window")
        return self

    def samples(self) -> int:
        return self.window


def _autocorrelations(r: np.ndarray, lags: int) -> tuple[list[float], float]:
    """``([ρ_1 … ρ_lags], variance)`` of ``r`` (the biased estimators); no ρ if ``r`` is
    constant or too short."""
    n = len(r)
    d = r - float(r.sum()) / n
    den = float(d @ d)
    if den <= 0.0 or n <= lags + 1:
        return [], den / n
    return [float(d[:-k] @ d[k:]) / den for k in range(1, lags + 1)], den / n


def _ljung_box_of(rho: list[float], n: int) -> float:
    return n * (n + 2) * sum(p * p / (n - k) for k, p in enumerate(rho, start=1))


def ljung_box(r: np.ndarray, lags: int) -> float:
    """The Ljung–Box statistic of residuals ``r`` over lags ``1..lags`` (0.0 if constant).

    Large values mean the residuals are correlated from step to step (not white noise).
    """
    return _ljung_box_of(_autocorrelations(r, lags)[0], len(r))


def unpredictable_fraction(rho: list[float]) -> float:
    """The share of a series' variance that its previous ``len(rho)`` values do not predict.

    ``Π(1 − φ_kk²)`` over the partial autocorrelations ``φ_kk`` of the autocorrelations
    ``rho`` (Levinson–Durbin, the Yule–Walker AR fit): 1.0 for white noise, near 0 for a
    swing that repeats (a zig-zag, a cycle).
    """
    phi: list[float] = []
    v = 1.0
    for k, rk in enumerate(rho, start=1):
        a = (rk - sum(phi[j] * rho[k - 2 - j] for j in range(k - 1))) / v
        a = max(-1.0, min(1.0, a))
        phi = [phi[j] - a * phi[k - 2 - j] for j in range(k - 1)] + [a]
        v *= 1.0 - a * a
        if v <= 0.0:
            return 0.0
    return v


def _residuals(x: np.ndarray, y: np.ndarray, degree: int) -> np.ndarray:
    """``y`` minus its least-squares polynomial of ``degree`` (1 or 2) over ``x``.

    Solves the 2×2 or 3×3 normal equations from their moments, in plain floats:
    ``np.polyfit`` or ``np.linalg.solve`` cost several times more for the ~100 samples
    used here, and this runs on the engine's hot path.
    """
    n = float(len(x))
    span = float(x[-1] - x[0])  # steps ascend in a window, but for a restarted run
    if span <= 0.0:
        span = float(x.max() - x.min())
    if span <= 0.0 or len(x) <= degree:
        return y - float(y.sum()) / n
    u = (x - float(x.sum()) / n) / span  # centred and scaled: well-conditioned for any step numbers
    s1, s2, t0, t1 = float(u.sum()), float(u @ u), float(y.sum()), float(u @ y)
    if degree == 1:
        det = n * s2 - s1 * s1
        if det <= 0.0:
            return y - t0 / n
        c1 = (n * t1 - s1 * t0) / det
        return y - ((t0 - c1 * s1) / n + c1 * u)
    u2 = u * u
    s3, s4, t2 = float(u2 @ u), float(u2 @ u2), float(u2 @ y)
    # Cramer's rule on [[n, s1, s2], [s1, s2, s3], [s2, s3, s4]] · c = [t0, t1, t2]
    det = n * (s2 * s4 - s3 * s3) - s1 * (s1 * s4 - s3 * s2) + s2 * (s1 * s3 - s2 * s2)
    if not det > 1e-12 * n * s4 * s2:  # (near) singular: too few distinct steps
        return _residuals(x, y, 1)
    c0 = (t0 * (s2 * s4 - s3 * s3) - s1 * (t1 * s4 - s3 * t2) + s2 * (t1 * s3 - s2 * t2)) / det
    c1 = (n * (t1 * s4 - t2 * s3) - t0 * (s1 * s4 - s3 * s2) + s2 * (s1 * t2 - t1 * s2)) / det
    c2 = (n * (s2 * t2 - s3 * t1) - s1 * (s1 * t2 - t1 * s2) + t0 * (s1 * s3 - s2 * s2)) / det
    return y - (c0 + c1 * u + c2 * u2)


def _detrend(
    steps: np.ndarray, values: np.ndarray, log: bool, degree: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Residuals around the trend (of ``log(values)`` when ``log`` and all positive), in
    step order, and the log values (None when the linear scale was used)."""
    logs = np.log(values) if log and float(values.min()) > 0.0 else None
    y = values if logs is None else logs
    return _residuals(steps.astype(np.float64), y, degree), logs


def _level_change(values: np.ndarray) -> float:
    """How far the level moved across the window, on the log scale: between the medians
    of its first and last thirds (positive values)."""
    k = max(1, len(values) // 3)
    a, b = median(values[:k].tolist()), median(values[-k:].tolist())
    return abs(math.log(b / a))


def _amplitude_of(r: np.ndarray, values: np.ndarray, logs: np.ndarray | None) -> tuple[float, float]:
    ordered = sorted(r.tolist())
    if logs is not None:
        lo, hi = math.exp(quantile(ordered, 0.05)), math.exp(quantile(ordered, 0.95))
        rel = (hi - lo) / (hi + lo)  # half-range over the midpoint: 1.3 / 0.7 → 0.3
        level = math.exp(float(logs.sum()) / len(logs))
        return rel, rel * level
    half = (quantile(ordered, 0.95) - quantile(ordered, 0.05)) / 2.0
    level = abs(float(values.sum()) / len(values))
    return (half / level if level > 0 else math.inf), half


def amplitude(
    steps: np.ndarray, values: np.ndarray, log: bool = True, degree: int = 2
) -> tuple[float, float]:
    """``(relative amplitude, absolute half-width)`` of the detrended series.

    The amplitude is relative to the level (``|mean|`` on the linear scale); :func:`detect`
    judges a window with values ≤ 0 against its noise instead.

    Args:
        steps: the x axis (step numbers).
        values: finite samples, same length as ``steps``, at least 2.
        log: detrend ``log(values)`` when all are positive.
        degree: degree of the trend polynomial.
    """
    r, logs = _detrend(steps, values, log, degree)
    return _amplitude_of(r, values, logs)


def detect(window: Window, params: OscillationParams, ctx: Context) -> Verdict | None:
    """Fire when the detrended relative amplitude over the window exceeds ``amplitude``
    and the residuals are correlated from step to step (Ljung–Box above ``q``).

    Returns:
        None with fewer than ``min_samples`` finite samples since ``ctx.since_step``.
        The verdict's value is the relative amplitude (0.3 = ±30 %): to the level, or
        where the window holds a value ≤ 0 to ``max(|mean|, noise × σ)``; it never fires
        while the level moves by more than ``max_trend``.
    """
    w = since(window, ctx.since_step)
    steps, values = w.steps, w.values
    ok = np.isfinite(values)
    if not ok.all():
        steps, values = steps[ok], values[ok]
    if len(values) < params.min_samples:
        return None
    r, logs = _detrend(steps, values, params.log, params.degree)
    use_log = logs is not None
    rel, half = _amplitude_of(r, values, logs)
    rho: list[float] | None = None
    if params.noise > 0.0 and float(values.min()) <= 0.0:  # no floor at 0: |mean| is no scale
        rho, var = _autocorrelations(r, params.lags)
        sigma = math.sqrt(var * unpredictable_fraction(rho))
        scale = max(abs(float(values.sum()) / len(values)), params.noise * sigma)
        rel = half / scale if scale > 0.0 else (math.inf if half > 0.0 else 0.0)
        detail = f"±{half:.3g} around the trend, {half / sigma if sigma > 0 else math.inf:.2g}× its noise"
    else:
        detail = f"±{rel:.0%} around the trend"
    firing = rel > params.amplitude and half > params.min_amplitude
    # the two guards below only ever veto, so the common quiet case skips them; the
    # whiteness test goes first, as small batches' independent noise is the usual veto
    if firing and params.q > 0.0:
        q = ljung_box(r, params.lags) if rho is None else _ljung_box_of(rho, len(r))
        firing = q > params.q
        detail += f", {'correlated' if firing else 'independent'} from step to step (Q={q:.0f})"
    if firing and params.max_trend > 0.0:
        if use_log:
            moved = _level_change(values)
            swing = math.atanh(min(rel, 1.0 - 1e-12))  # the residuals' half-width, log scale
            if moved > max(math.log(params.max_trend), 2.0 * swing):
                # a learning phase: its curvature is not a swing
                firing = False
                detail += f", level moved {math.exp(moved):.3g}×"
        elif rho is not None:  # no floor at 0: no factor, but the same "twice the swings"
            # means, not medians: a third of a two-level bounce has its median anywhere
            # between the two levels
            k = max(1, len(values) // 3)
            shift = float(values[-k:].sum() - values[:k].sum()) / k
            if abs(shift) > 2.0 * half:
                firing = False
                detail += f", level moved {shift:+.3g}"
    return Verdict(firing, rel, params.amplitude, detail=detail)
