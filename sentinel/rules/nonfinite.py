"""``nonfinite``: a NaN or Inf appeared in the loss, the gradients or the parameters.

The engine records ``sentinel_nonfinite_detected{source}`` = 1.0 at a step where that source held a
non-finite value, else 0.0, and passes the names of the non-finite groups, first ones
first, in the context.
"""

from __future__ import annotations

import math

from sentinel.rules.base import Context, Params, Verdict
from sentinel.store import Window


class NonFiniteParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        ignore_on_amp_skip: sources whose non-finite values are expected when the AMP
            scaler skipped the step: an fp16 overflow in the gradients is how
            ``GradScaler`` finds its scale, and the step is not applied.
        ignore_on_guard_skip: sources whose non-finite values never reached the weights
            when the step guard skipped the step (``StepSkipped`` reports it, as info).
        max_groups: at most this many group names are carried into the alert.
    """

    ignore_on_amp_skip: list[str] = ["grad"]
    ignore_on_guard_skip: list[str] = ["grad", "loss"]
    max_groups: int = 8


def idle(flag: float, params: NonFiniteParams) -> bool:
    """True when the latest flag is 0.0: nothing to fire on."""
    return flag == 0.0


def detect(window: Window, params: NonFiniteParams, ctx: Context) -> Verdict | None:
    """Fire when the latest sample flags a non-finite value (any non-zero, or NaN).

    Returns:
        None for an empty window. The verdict's ``detail`` is the source (``loss``,
        ``grad`` or ``param``) and ``groups`` the first non-finite groups of that source.
    """
    if len(window) == 0:
        return None
    flag = float(window.values[-1])
    source = ctx.series.get("source", "")
    bad = flag != 0.0 or math.isnan(flag)
    if bad and ctx.amp_skipped and source in params.ignore_on_amp_skip:
        bad = False
    if bad and ctx.guard_skipped and source in params.ignore_on_guard_skip:
        bad = False
    groups: tuple[str, ...] = ()
    if bad:
        groups = tuple(ctx.nonfinite_groups.get(source, ()))[: params.max_groups]
    detail = source or "value"
    if bad and source == "loss" and ctx.note:  # a loss the script threw away, skipping its step (engine/ingest.py)
        detail += f" ({ctx.note})"
    return Verdict(bad, 1.0 if bad else 0.0, 0.0, detail=detail, groups=groups)
