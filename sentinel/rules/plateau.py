"""``plateau``: the loss has not improved by ``min_delta`` (relative) over a long window.

Per-batch loss is noisy, so levels are medians of ``chunk`` samples: the level at the
start of the window is compared with the level at its end. (The minimum over many noisy
levels would be biased low, and would find "improvement" in a flat series.) Only samples
since warm-up or the last learning-rate change count, and the window must be full: a
plateau is judged over the whole ``window``.
"""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from sentinel.rules.base import Context, Params, Verdict, finite, median, since
from sentinel.store import Window


class PlateauParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        window: samples judged; must not exceed the store's capacity per series.
        chunk: samples per level estimate (the first and the last ``chunk`` samples).
        min_delta: the end level must be at least this fraction below the start level.
    """

    window: int = Field(default=500, ge=4)
    chunk: int = Field(default=100, ge=1)
    min_delta: float = Field(default=0.01, ge=0.0)

    @model_validator(mode="after")
    def _fits(self) -> PlateauParams:
        if self.window < 2 * self.chunk:
            raise ValueError("window must hold at least two chunks")
        return self

    def samples(self) -> int:
        return self.window


def detect(window: Window, params: PlateauParams, ctx: Context) -> Verdict | None:
    """Fire when the relative improvement over the window is below ``min_delta``.

    Returns:
        None until ``window`` finite samples exist since ``ctx.since_step``. The
        verdict's value is the relative improvement (negative: the loss got worse).
    """
    w = since(window, ctx.since_step)
    vals = finite(w.values.tolist())
    if len(vals) < params.window:
        return None
    vals = vals[-params.window :]
    first, best = median(vals[: params.chunk]), median(vals[-params.chunk :])
    if first == 0.0:
        return None
    improvement = (first - best) / abs(first)
    if not math.isfinite(improvement):
        return None
    detail = f"level {best:.4g} vs {first:.4g} {params.window} samples ago"
    return Verdict(improvement < params.min_delta, improvement, params.min_delta, first, detail)
