"""``skip``: the step guard skipped steps (``sentinel_guard_consecutive_skips``).

The series holds, at each step the guard wrote a note for, the skips in a row up to it (0
at the first applied step after skips). The rule fires when it reaches ``min_consecutive``;
its detail is the engine's description of the step (reason, norm against the bound, the
batch: :func:`sentinel.engine.guard.describe`), its groups those that held non-finite values.
"""

from __future__ import annotations

from pydantic import Field

from sentinel.rules.base import Context, Params, Verdict
from sentinel.store import Window


class SkipParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        min_consecutive: skips in a row that fire (1: every skip).
    """

    min_consecutive: int = Field(default=1, ge=1)


def idle(value: float, params: SkipParams) -> bool:
    return not value >= params.min_consecutive


def detect(window: Window, params: SkipParams, ctx: Context) -> Verdict | None:
    """Fire when the latest count of skips in a row is at least ``min_consecutive``."""
    if len(window) == 0:
        return None
    value = float(window.values[-1])
    firing = value >= params.min_consecutive
    return Verdict(firing, value, float(params.min_consecutive), detail=ctx.note if firing else "",
                   groups=tuple(ctx.nonfinite_groups.get("guard", ()))[:8] if firing else ())
