"""``spike``: the latest sample jumped far above a robust rolling baseline.

The baseline is the median of the previous ``window`` samples and its spread the scaled
median absolute deviation (MAD), both on a log scale for positive series, so a loss of
2.0 → 6.0 and a gradient norm of 1.0 → 3.0 are the same size of event. A sample fires
only when it is both ``factor`` times the baseline *and* ``z`` robust standard deviations
above it:

- the factor keeps a very steady series from firing on small moves;
- the z-score keeps a very noisy series from firing on its ordinary extremes;
- a slow ramp never fires, because the median follows it: the latest sample of a ramp
  is only a few percent above the middle of its own recent past.

A series resting at a floor of exactly 0 (a margin loss that every sample of most batches
satisfies: a triplet, a contrastive or a hinge loss once the embeddings separate; the
gradient norm of those steps) has a median of 0 and no spread, so any batch that misses
a margin read as a spike "10⁹ times its usual spread" (a triplet-loss run that was 0 at
1,937 of 2,000 steps paged LossSpike and GradientSpike at step 42). There the baseline is
that of the samples above 0, on the log scale as for any positive series: the latest
must be ``factor`` times their median and ``z`` robust deviations above it. With fewer
than 5 of them there is no scale, and no verdict (the margin losses' own level rules still
judge a loss that leaves 0 for good).

A spike on the script's own schedule is no trouble: rosinality's StyleGAN2 ``train.py``
(and its many ports) steps the discriminator a second time every 16 iterations on the R1
penalty alone (lazy regularization), whose gradient norm was 10-25 against 0.5-1 for the
other steps, every 17th step of its stream; ``GradientSpike`` paged at each. With
``skip_periodic``, a sample that would fire is not a spike when the two latest samples of
its window (the warm-up's included) at its level (below) lie at the same interval as it
does from the later of them (the spikes at steps 19, 36 and 53: every 17 steps). The first
two of a schedule can fire, and spikes at uneven steps (an unstable run's) fire each time.

A spike is rare, too. Multi-task training that draws each batch from one task in proportion
to the tasks' sizes (MT-DNN's shape: one optimizer over a shared trunk and a head per task)
reports one task's loss per step, and a task whose loss is 10× the others' at 15 % of the
batches gave LossSpike and GradientSpike verdicts at 44 and 47 of 1,500 steps: in a long
run, a page every cooldown. With ``max_share``, a sample that would fire is not a spike when
at least that share of its baseline (and two samples) was already at its level (within
``factor`` of its value, and above the threshold): a level the series keeps visiting is one
of its levels; the mixture above then gave 1 verdict of each in 1,500 steps. (Near its
value, not merely above the threshold: the earlier half of a falling loss's baseline is
above 1.5 times its median, and a spike 60 times it is at no level it visited.)

Samples before ``ctx.since_step`` (warm-up, the last learning-rate change) are not part of
the baseline, so an lr decay or the first steps' fast fall never form a baseline that a
later sample seems to "spike" from.

Cost: a full evaluation sorts the baseline. It leaves the sorted baseline in ``ctx.memo``
with the same samples in order and the latest, and :func:`quiet` answers from them without
the window. For the next sample it moves the baseline on by one exactly (the latest in, the
oldest out: a bisection each) and compares the sample with the threshold a full evaluation
would take, so only a sample at or above it costs a full evaluation. For a sample ``k``
later (samples the rule did not judge: a grace period) the baseline has lost and gained at
most ``k`` samples, so its median is at least the sorted old baseline's element ``k``
places below the middle, and a value under ``factor`` times that cannot reach the
threshold.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_left, bisect_right, insort
from typing import Any

from pydantic import Field

from sentinel.rules.base import Context, Params, Verdict, quantile, since
from sentinel.store import Window


class SpikeParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        window: samples before the latest that form the baseline.
        min_samples: fewer baseline samples than this give no verdict.
        factor: the latest must be at least ``factor × baseline``.
        z: ... and at least this many robust standard deviations above it.
        log: use a log scale when all samples are positive.
        min_spread: floor of the spread, relative (log scale) or as a fraction of
            ``|baseline|`` (linear), so a perfectly flat series has a finite z-score.
        min_value: the latest must also be at least this (an absolute level that matters,
            e.g. GVR 0.5: a rise from 0.01 to 0.05 is no noise worth a page).
        skip_periodic: no fire when the two latest samples before it at its level (within
            ``factor`` of it, above the threshold; the warm-up's included) came at its
            interval: a spike every N steps is the script's schedule (lazy
            regularization), not trouble.
        max_share: no fire when at least this share of the baseline's samples (and two)
            were at its level already (within ``factor`` of it, above the threshold): one of
            the series' levels (a mixture of tasks drawn per batch), not a spike. 0: off.
    """

    window: int = Field(default=50, ge=3)
    min_samples: int = Field(default=10, ge=3)
    factor: float = Field(default=10.0, gt=1.0)
    z: float = Field(default=6.0, gt=0.0)
    log: bool = True
    min_spread: float = Field(default=0.05, gt=0.0)
    min_value: float = -math.inf
    skip_periodic: bool = True
    max_share: float = Field(default=0.05, ge=0.0, le=1.0)

    def samples(self) -> int:
        return self.window + 1


def detect(window: Window, params: SpikeParams, ctx: Context) -> Verdict | None:
    """Fire when the latest sample is a spike over the baseline of the samples before it.

    Returns:
        None with too few finite baseline samples or a non-finite latest sample
        (non-finite values are the ``nonfinite`` rule's). Otherwise a verdict whose
        value is the latest sample, threshold ``factor × baseline`` and baseline the
        median.
    """
    vals = since(window, ctx.since_step).values
    if len(vals) < params.min_samples + 1:
        return None
    last = float(vals[-1])
    if not math.isfinite(last):
        return None
    ring = vals[-params.window - 1 : -1].tolist()
    base = ring if math.isfinite(sum(ring)) else [x for x in ring if math.isfinite(x)]  # rare: a NaN/Inf among them
    if len(base) < params.min_samples:
        return None
    base = sorted(base)
    if ctx.memo is not None:  # for quiet(): the baseline sorted and in order, the latest, where it started
        ctx.memo.update(base=base, ring=ring, latest=last, since=ctx.since_step, step=int(window.steps[-1]))
    baseline = quantile(base, 0.5)
    if baseline == 0.0 and base[0] >= 0.0:  # resting at its floor of 0: the scale is its largest
        verdict, level = _at_floor(last, base, params)
        return _recurring(verdict, level, base, window, params)
    threshold = baseline + (params.factor - 1.0) * abs(baseline)
    if last < params.min_value:
        return Verdict(False, last, max(threshold, params.min_value), baseline=baseline)
    if last < threshold:  # the common case: no need for the spread (nor the detail)
        return Verdict(False, last, threshold, baseline=baseline)
    if params.log and last > 0.0 and base[0] > 0.0:
        med = math.log(baseline)
        dev = sorted(abs(math.log(x) - med) for x in base)
        spread = max(quantile(dev, 0.5) * 1.4826, params.min_spread)
        z = (math.log(last) - med) / spread
    else:
        dev = sorted(abs(x - baseline) for x in base)
        spread = max(quantile(dev, 0.5) * 1.4826, params.min_spread * abs(baseline), 1e-12)
        z = (last - baseline) / spread
    # where a sample of the series counts as at the latest's level: within the factor of it
    # and above the threshold (a falling loss's earlier samples are above the threshold, not
    # at a spike's level), or where the spread is the scale (a baseline at or below 0), z
    # robust deviations above it
    level = max(threshold, last / params.factor) if baseline > 0 else max(threshold, baseline + params.z * spread)
    if baseline > 0:
        detail = f"{last / baseline:.3g}× the baseline {baseline:.3g}"
    else:  # a loss without a floor at 0 (a negative ELBO, a learned-variance weighting): no ratio
        detail = f"{last - baseline:.3g} above the baseline {baseline:.3g}, {z:.1f}× its usual spread"
    return _recurring(Verdict(z >= params.z, last, threshold, baseline=baseline, detail=detail), level, base, window,
                      params)


def _recurring(verdict: Verdict | None, level: float, base: list[float], window: Window,
               params: SpikeParams) -> Verdict | None:
    """``verdict``, made quiet where it fires on a level the series has been at before:
    ``params.max_share`` of the (sorted) baseline ``base`` at or above ``level`` (within
    ``factor`` of the latest and above the threshold; ``z`` deviations above a baseline at
    or below 0), or (``params.skip_periodic``) the two latest of the window's samples
    before it at that level at the interval of the latest from the later of them. The
    warm-up's samples count for the schedule: a schedule is the script's from its first
    step, though no baseline is."""
    if verdict is None or not verdict.firing:
        return verdict
    if params.max_share > 0:
        seen = len(base) - bisect_left(base, level)
        if seen >= 2 and seen >= params.max_share * len(base):
            return dataclasses.replace(verdict, firing=False, detail=(
                f"{verdict.detail}; {seen} of the {len(base)} samples before it reached {level:.3g} too: "
                "a level of the series (tasks or sources of different losses), not a spike"))
    if not params.skip_periodic:
        return verdict
    n = params.window
    steps = window.steps[-n - 1:].tolist()
    at = [s for s, v in zip(steps[:-1], window.values[-n - 1:-1].tolist()) if v >= level]
    if len(at) < 2 or not steps[-1] - at[-1] == at[-1] - at[-2] > 0:
        return verdict
    return dataclasses.replace(verdict, firing=False, detail=(
        f"{verdict.detail}; as at steps {at[-2]} and {at[-1]}: every {steps[-1] - at[-1]} steps, the script's "
        "schedule (a regularization step), not a spike"))


def _at_floor(last: float, base: list[float], params: SpikeParams) -> tuple[Verdict | None, float]:
    """The verdict on ``last`` over a sorted baseline whose median is 0 and nothing below
    it: against the samples above 0 (None with fewer than 5 of them: no scale); and the
    level a sample of the series counts as at the latest's (within ``factor`` of it, and
    the threshold)."""
    above = [x for x in base if x > 0.0]
    if len(above) < 5:
        return None, math.inf
    med = quantile(above, 0.5)
    threshold = max(params.factor * med, params.min_value)
    detail = f"{last / med:.3g}× the median {med:.3g} of the {len(above)} of {len(base)} before it above 0"
    if not last >= threshold:
        return Verdict(False, last, threshold, baseline=0.0, detail=detail), threshold
    logs = sorted(abs(math.log(x / med)) for x in above)
    spread = max(quantile(logs, 0.5) * 1.4826, params.min_spread)
    return Verdict(math.log(last / med) / spread >= params.z, last, threshold, baseline=0.0, detail=detail), max(
        threshold, last / params.factor)


def quiet(value: float, params: SpikeParams, memo: dict[str, Any], appended: int) -> bool:
    """True when ``value`` cannot be a spike, judged from the baseline that :func:`detect`
    left in ``memo`` ``appended`` samples ago, or that this function moved on since (see
    the module docstring).

    For the next sample (``appended`` 1) the answer is exact, and the memo moves on by that
    sample (a full verdict renews it where the answer is no). Later ones get the bound, for a positive baseline only (the
    threshold is then ``factor ×`` the median). A value that is not finite is the
    non-finite rule's, so it is quiet here too."""
    base = memo.get("base")
    if not base:
        return False
    if appended == 1:
        return _next(value, params, memo, base)
    i = (len(base) - 1) // 2 - appended
    if i < 0 or base[i] <= 0.0:
        return False
    return not value >= params.factor * base[i] or not math.isfinite(value)


def _next(value: float, params: SpikeParams, memo: dict[str, Any], base: list[float]) -> bool:
    """:func:`quiet` for the sample after ``memo["latest"]``: the baseline moved on by one
    exactly (a window of samples before ``value``, the non-finite left out), then the
    comparisons :func:`detect` makes before it would need the spread: True where it would
    give no verdict or one under its threshold."""
    ring = memo["ring"]
    latest = memo["latest"]
    ring.append(latest)
    if math.isfinite(latest):
        insort(base, latest)
    if len(ring) > params.window:
        old = ring.pop(0)
        if math.isfinite(old):
            del base[bisect_left(base, old)]
    memo["latest"] = value
    memo["count"] += 1
    if not math.isfinite(value) or len(base) < params.min_samples:
        return True  # detect() gives no verdict
    baseline = quantile(base, 0.5)
    if baseline == 0.0 and base[0] >= 0.0:  # at its floor of 0: against the samples above it, as _at_floor()
        i = bisect_right(base, 0.0)
        return len(base) - i < 5 or not value >= max(params.factor * quantile(base[i:], 0.5), params.min_value)
    return value < params.min_value or value < baseline + (params.factor - 1.0) * abs(baseline)
