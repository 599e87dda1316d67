"""``threshold``: the latest value (or a reduction of the last few) compared with a constant.

"For K steps" is not this detector's business: the rule's ``for_steps`` counts
consecutive failing evaluations in the life cycle.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, PositiveInt

from sentinel.rules.base import Context, Params, Verdict, median
from sentinel.store import Window

Op = Literal[">", ">=", "<", "<="]


class ThresholdParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        op: how the value must compare with ``value`` for the rule to fail.
        value: the constant threshold.
        reduce: ``last`` compares the latest sample; the others reduce the last
            ``window`` finite samples first.
        window: samples reduced when ``reduce`` is not ``last``.
        skip_zero: an exact 0.0 gives no verdict. For per-group gradient norms an exact
            zero means "no gradient reached this group" (frozen or unused parameters),
            which is not a vanishing gradient.
        unless_reference: the value holds (does not fail) while the rule's ``reference``
            metric's latest sample equals this: ``GradientExplosion`` for a stream whose
            optimizers are all adaptive (``sentinel_optimizer_adaptive`` 1).
        step_share: with ``>`` or ``>=``, the threshold is at least this share of the step
            number: a count of steps that must be long next to the run so far.
        while_reference_below: the value fails only while the rule's ``reference``
            metric's latest sample is below this (none yet: it holds), a condition that
            says the failing value matters: ``OptimizerStateSaturated`` while the updates
            have stalled (``sentinel_update_ratio`` under 1e-4).
    """

    op: Op = ">"
    value: float
    reduce: Literal["last", "mean", "median", "min", "max"] = "last"
    window: PositiveInt = 1
    skip_zero: bool = False
    unless_reference: float | None = None
    step_share: float = Field(default=0.0, ge=0.0)
    while_reference_below: float | None = None

    def samples(self) -> int:
        return 1 if self.reduce == "last" else self.window


def compare(value: float, op: Op, threshold: float) -> bool:
    """``value <op> threshold``."""
    if op == ">":
        return value > threshold
    if op == ">=":
        return value >= threshold
    if op == "<":
        return value < threshold
    return value <= threshold


def check(value: float, params: ThresholdParams, reference: float | None = None, step: int = 0) -> Verdict | None:
    """The verdict for one already reduced value (at ``step``); None for NaN or a skipped zero.

    NaN gives no verdict: non-finite values are the ``nonfinite`` detector's to report,
    and a NaN must neither fire nor resolve a threshold rule. ±inf compares normally.
    """
    if math.isnan(value) or (params.skip_zero and value == 0.0):
        return None
    threshold = params.value
    if params.step_share and params.op in (">", ">="):
        threshold = max(threshold, params.step_share * step)
    firing = compare(value, params.op, threshold)
    if firing and params.unless_reference is not None and reference == params.unless_reference:
        return Verdict(False, value, threshold, detail="holds: the reference says it does not apply")
    if firing and params.while_reference_below is not None and not (
            reference is not None and reference < params.while_reference_below):
        return Verdict(False, value, threshold, detail=f"holds: the reference is not below {params.while_reference_below:g}")
    return Verdict(firing, value, threshold)


def idle(value: float, params: ThresholdParams) -> bool:
    """True when the latest value alone cannot fire (exact for ``reduce: last``)."""
    if params.reduce != "last":
        return False
    return math.isnan(value) or not compare(value, params.op, params.value)


def detect(window: Window, params: ThresholdParams, ctx: Context) -> Verdict | None:
    """Compare the latest sample, or a reduction of the last ``window`` samples.

    Returns:
        None when the window is empty or holds no usable value.
    """
    if len(window) == 0:
        return None
    if params.reduce == "last":
        return check(float(window.values[-1]), params, ctx.reference, ctx.step)
    vals = [v for v in window.values[-params.window :].tolist() if not math.isnan(v)]
    if not vals:
        return None
    if params.reduce == "mean":
        value = sum(vals) / len(vals)
    elif params.reduce == "median":
        value = median(vals)
    elif params.reduce == "min":
        value = min(vals)
    else:
        value = max(vals)
    return check(value, params, ctx.reference, ctx.step)
