"""``band``: the value left ``[low, high]`` for the last ``consecutive`` samples."""

from __future__ import annotations

import math

from pydantic import PositiveInt, model_validator

from sentinel.rules.base import Context, Params, Verdict
from sentinel.store import Window


class BandParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        low: values below fail (default: no lower bound).
        high: values above fail (default: no upper bound).
        consecutive: how many of the latest samples must all be outside the band.
            This counts samples, whereas the rule's ``for_steps`` counts evaluations;
            use either.
    """

    low: float = -math.inf
    high: float = math.inf
    consecutive: PositiveInt = 1

    @model_validator(mode="after")
    def _ordered(self) -> BandParams:
        if not self.low < self.high:
            raise ValueError("low must be below high")
        return self

    def samples(self) -> int:
        return self.consecutive


def detect(window: Window, params: BandParams, ctx: Context) -> Verdict | None:
    """Fire when each of the last ``consecutive`` samples is outside ``[low, high]``.

    Returns:
        None with fewer than ``consecutive`` samples or a NaN among them. The verdict's
        threshold is the bound the latest sample is nearest to crossing or crossed.
    """
    if len(window) < params.consecutive:
        return None
    vals = window.values[-params.consecutive :].tolist()
    if any(math.isnan(v) for v in vals):
        return None
    outside = all(v < params.low or v > params.high for v in vals)
    last = vals[-1]
    if last < params.low:
        bound = params.low
    elif last > params.high:
        bound = params.high
    else:
        # inside: report the nearer bound (in ratio terms for positive bounds)
        bound = params.low if _closer_to_low(last, params) else params.high
    return Verdict(outside, last, bound)


def _closer_to_low(v: float, p: BandParams) -> bool:
    if not math.isfinite(p.high):
        return True
    if not math.isfinite(p.low):
        return False
    if v > 0 and p.low > 0:
        return v / p.low < p.high / v
    return v - p.low < p.high - v
