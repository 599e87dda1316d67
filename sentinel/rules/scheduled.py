"""``scheduled``: a threshold on the value the run would show at its peak learning rate.

Every optimizer the seeds cover moves the weights in proportion to the learning rate (SGD
and its momentum, Adam, Adafactor, LAMB's trust-scaled step, Lion's sign step, Sophia's
clipped step), so the update ratio divided by the schedule fraction (``ctx.lr_fraction``:
lr over its peak) is the ratio the same gradients would give at the peak. Comparing that
with the threshold:

- a cosine decay to zero or a warmup's first steps make the ratio tiny and the fraction
  tiny with it: the quotient stays where it was, and nothing fires;
- a learning rate too low from the start has a fraction of 1 and is judged as it is;
- vanishing gradients shrink the ratio with the fraction unchanged, and fire.

Below ``min_fraction`` (the last steps of a decay to exactly zero) there is no verdict: the
quotient of two tiny numbers says nothing. Without a known fraction, the value is judged
as it is.

With ``unless_converged``, the value holds while the loss (the rule's
``reference``: the median of its last 3 samples) is below that fraction of where it began
(``ctx.loss_start``): a training that has fitted its data has tiny gradients, so tiny
updates, by its own success. A classifier memorising 256 samples (its loss 1.39 → 9e-5)
and d2l.ai's linear regression (35 → 5e-5, its noise floor) warned ``UpdateRatioLow``,
whose causes (a learning rate too small, vanishing gradients) sent the reader the wrong
way. A loss still near its start (vanishing gradients, an lr too low from step 1) fires.
"""

from __future__ import annotations

import math

from pydantic import Field

from sentinel.rules.base import Context, Params, Verdict, median
from sentinel.rules.threshold import Op, compare
from sentinel.store import Window


class ScheduledParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        op: how the value at the peak lr must compare with ``value`` to fail.
        value: the threshold, for the value at the peak learning rate.
        skip_zero: an exact 0.0 gives no verdict.
        min_fraction: below this schedule fraction, no verdict.
        unless_converged: the value holds while the loss (the rule's ``reference``) is
            below this fraction of where it began; None: the loss is not read.
    """

    op: Op = "<"
    value: float
    skip_zero: bool = False
    min_fraction: float = Field(default=1e-3, ge=0.0, le=1.0)
    unless_converged: float | None = Field(default=None, gt=0.0, lt=1.0)

    def reference_samples(self) -> int:
        return 3 if self.unless_converged is not None else 0


def detect(window: Window, params: ScheduledParams, ctx: Context) -> Verdict | None:
    """Compare the latest sample divided by ``ctx.lr_fraction`` with the threshold.

    Returns:
        None for an empty window, NaN, a skipped zero, or a fraction below
        ``min_fraction``; a quiet verdict for a fitted training (``unless_converged``). The verdict's value is the latest sample as it is; its
        threshold is the one it was held to (``value × fraction``).
    """
    if len(window) == 0:
        return None
    v = float(window.values[-1])
    if math.isnan(v) or (params.skip_zero and v == 0.0):
        return None
    if params.unless_converged is not None and _converged(ctx, params.unless_converged):
        # a quiet verdict, not none: an alert raised before the fit resolves
        return Verdict(False, v, params.value, detail=f"the loss is below {params.unless_converged:.0%} of its start")
    f = ctx.lr_fraction
    if f is None or not math.isfinite(f) or f >= 1.0:
        return Verdict(compare(v, params.op, params.value), v, params.value)
    if f < params.min_fraction:
        return None
    detail = f"lr at {f:.2g} of its peak, so held to {params.value * f:.2g}"
    return Verdict(compare(v / f, params.op, params.value), v, params.value * f, detail=detail)


def _converged(ctx: Context, share: float) -> bool:
    """Whether the loss's level (the median of its last 3 samples) is below ``share`` of
    where it began; False when either is unknown or the start is not positive."""
    start, ref = ctx.loss_start, ctx.reference_window
    if start is None or not start > 0 or ref is None or len(ref) == 0:
        return False
    level = median(ref.values[-3:].tolist())
    return level < share * start
