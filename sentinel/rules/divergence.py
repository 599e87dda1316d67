"""``divergence``: the current level stays far above the best level reached.

The current level is the median of the last ``recent`` samples, so a single bad batch
does not count (that is a spike). The best level is the lowest median of consecutive
``chunk``-sample chunks before it, since warm-up or the last learning-rate change. A loss
that keeps climbing, or jumped and stayed up, ends up ``factor`` times its best level.

"``factor`` times" is a rise of ``(factor − 1)·|best|``, which measures a rise only when 0
is the loss's floor. Many losses have no such zero: PPO's clipped surrogate plus value loss
minus an entropy bonus sits around 0 with either sign, a Gaussian VAE's negative ELBO falls
through 0 as it fits. There a best level near 0 made any rise "twice" it (a clean PPO run
whose 50-step level went from -0.0085 to +0.0061, with batch-to-batch noise of 0.009, was
"diverging"). So the rise is measured against ``max(|best|, noise·σ)``, σ the median
robust spread (1.4826 × MAD) of the samples within their chunks: the level's move is judged
against the loss's own noise, not against its distance from an arbitrary 0.

The same holds for a positive loss at its noise floor. A small regression fitted down to
where its batches' losses are mostly noise (a sine fine-tuned by Adam at a constant lr:
best level 0.0004, single batches spread by 0.0009) wanders between medians of 0.0004 and
0.0011 over hundreds of steps, "2.7× its best" and yet within one batch's spread of it; it
paged critical. Where a loss's level is well above its batches' spread (any loss still far
from its floor), ``|best|`` is the larger and the ratio decides as before. σ is computed
only when the ratio alone would fire (or the window holds a value ≤ 0), so a quiet
verdict costs nothing more.

A firing verdict keeps its best level (``ctx.memo``) until the loss comes back under its
threshold. Without it, a run whose loss jumped and stayed up resolved its critical alert
once its good steps had left the window: a regression network killed by one corrupt batch
sat at 800× its best level when its page said "resolved", 400 steps later. The kept level
holds for one baseline only: a warm restart or weights the script set start a new one.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field, model_validator

from sentinel.rules.base import Context, Params, Verdict, median, row_medians, since
from sentinel.store import Window


class DivergenceParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        window: samples considered (bounded by the store's capacity).
        recent: samples whose median is the current level.
        chunk: chunk size for the best level.
        factor: fire when current > best + (factor − 1)·|best| (see ``noise``).
        min_samples: fewer samples than this (since warm-up / lr change) give no verdict.
        min_rise: the current level must also exceed the best by this absolute amount,
            so a loss resting at ~0 does not "double" on noise.
        noise: the rise is ``(factor − 1)`` times ``max(|best|, noise × σ)``, σ the
            robust spread of the samples within their chunks: a loss without a floor at
            0, or one at its noise floor, is judged against its batches' spread.
    """

    window: int = Field(default=400, ge=10)
    recent: int = Field(default=20, ge=1)
    chunk: int = Field(default=20, ge=1)
    factor: float = Field(default=2.0, gt=1.0)
    min_samples: int = Field(default=80, ge=2)
    min_rise: float = Field(default=1e-6, ge=0.0)
    noise: float = Field(default=3.0, ge=0.0)

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
    rows = older[len(older) - n :].reshape(-1, c)
    meds = row_medians(rows)
    best = float(meds.min())
    memo = ctx.memo
    held = None if memo is None else memo.get("held")
    if held is not None and (held[0] != ctx.since_step or held[1] >= best):
        held = None  # a new baseline, or the window holds a level as low again
    if held is not None:  # firing, and the best level has left the window since
        best = held[1]
    threshold = best + max((params.factor - 1.0) * abs(best), params.min_rise)
    # no floor at 0 (|best| is no scale), or a rise the batches' spread may hold: the noise
    # decides too. Only raises the threshold, so a positive loss below it needs no σ
    if params.noise > 0.0 and (current > threshold or float(vals.min()) <= 0.0):
        sigma = 1.4826 * float(np.median(np.median(np.abs(rows - meds[:, None]), axis=1)))
        scale = max(abs(best), params.noise * sigma)
        threshold = best + max((params.factor - 1.0) * scale, params.min_rise)
    firing = current > threshold
    if memo is not None:
        if firing:  # the level it must come back to, kept until it does
            memo["held"] = (ctx.since_step, best)
        else:
            memo.pop("held", None)
    if best > 0:
        detail = f"{current / best:.3g}× the best level {best:.3g}"
    else:  # a ratio to a level at or below 0 says nothing
        detail = f"{current - best:.3g} above the best level {best:.3g}"
    if held is not None:
        detail += f" (reached before the last {len(window)} samples, and not since)"
    return Verdict(firing, current, threshold, baseline=best, detail=detail)
