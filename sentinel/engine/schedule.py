"""Each param group's peak learning rate, so rules can tell a schedule's small lr from a
learning rate that is simply too low.

The peak of a group is the larger of the highest lr it has reported and the lr its torch
scheduler scales from (``lr_peak`` in the frame: ``initial_lr`` / ``max_lr``). The
*schedule fraction* of a rank is ``max over groups of lr / peak``: 1 for a constant lr
(too low from the start included), near 0 at the end of a decay to zero or at the start of
a warmup the scheduler announced.

A *warm restart* is a schedule taking the lr back up: SGDR's ``CosineAnnealingWarmRestarts``
and a cosine with hard restarts jump from about 0 to the peak in one step, ``CyclicLR``
climbs back from its base each cycle (its scheduler scales from that base, so the peak is
the highest lr seen), a ``CosineAnnealingLR`` run past its ``T_max`` climbs again. A group
with a scheduler restarts when its lr reaches half its peak again after it had fallen
below a quarter of it, once it had been at half its peak before (a warmup's first climb
is no restart). The loss climbing out of the minimum it is kicked from is then the
schedule's design (the rules' ``restart_grace_steps``).

Only a schedule's doing counts. A group without a scheduler whose lr falls more than
``ABRUPT`` times in one report (someone set ``group["lr"]`` by hand) starts a new peak
at the new value: a lr cut by hand to 1e-4 of what it was is judged as it is. Steps of a
decay far below the peak (the last ones of a cosine, to 0) never restart it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

ABRUPT = 20.0
"""A fall of more than this factor in one report, by hand, restarts the group's peak (a
StepLR by hand with gamma 0.1 is 10×, a schedule; 1e-4 of the lr at once is not)."""
NEAR_PEAK = 0.01
"""... unless the lr was already below this fraction of its peak (the end of a decay)."""
HIGH, LOW = 0.5, 0.25
"""A scheduled group's lr at ``HIGH`` of its peak or more after it had fallen below ``LOW``
of it is a warm restart."""


class SchedulePeaks:
    """Per rank (any hashable key): each group's peak lr and the schedule fraction.

    Args:
        max_keys: ranks kept; the oldest is forgotten first.
    """

    def __init__(self, max_keys: int = 10_000) -> None:
        self.max_keys = max_keys
        self._peaks: dict[Hashable, list[float]] = {}
        self._last: dict[Hashable, list[float]] = {}
        self._fraction: dict[Hashable, float] = {}
        # per group: None until its lr reached HIGH of its peak, then whether it fell below LOW since
        self._low: dict[Hashable, list[bool | None]] = {}
        self.restarted = False
        """Whether the last :meth:`update` found a warm restart."""

    def update(self, key: Hashable, lrs: Sequence[float], hints: Sequence[float] | None = None) -> float | None:
        """Record a report's learning rates (and its schedulers' peaks, NaN where none).

        Returns:
            The schedule fraction, or None when no group has a positive peak; :attr:`restarted`
            tells whether these rates restart the schedule.
        """
        peaks = self._peaks.get(key)
        last = self._last.get(key)
        low = self._low.get(key)
        self.restarted = False
        if peaks is None or low is None or len(peaks) != len(lrs):
            if len(self._peaks) >= self.max_keys and key not in self._peaks:
                self.forget([next(iter(self._peaks))])
            peaks = [float("nan")] * len(lrs)
            low = self._low[key] = [None] * len(lrs)
            last = None
        hints = hints if hints is not None and len(hints) == len(lrs) else None
        best: float | None = None
        for i, lr in enumerate(lrs):
            if not math.isfinite(lr) or lr < 0:
                continue
            hint = hints[i] if hints is not None else math.nan
            scheduled = math.isfinite(hint) and hint > 0
            peak = peaks[i]
            if (not scheduled and last is not None and math.isfinite(last[i]) and math.isfinite(peak)
                    and lr * ABRUPT < last[i] and last[i] >= NEAR_PEAK * peak):
                peak = lr  # cut by hand, not by a schedule: a new start
            peak = max(x for x in (peak, lr, hint if scheduled else math.nan, 0.0) if not math.isnan(x))
            peaks[i] = peak
            if scheduled and peak > 0:
                if lr >= HIGH * peak:
                    self.restarted = self.restarted or low[i] is True
                    low[i] = False
                elif lr < LOW * peak and low[i] is False:
                    low[i] = True
            if peak > 0:
                f = lr / peak
                best = f if best is None else max(best, f)
        self._peaks[key] = peaks
        self._last[key] = list(lrs)
        if best is None:
            self._fraction.pop(key, None)
        else:
            self._fraction[key] = best
        return best

    def keys(self) -> list[Hashable]:
        """The keys kept."""
        return list(self._peaks)

    def fraction(self, key: Hashable) -> float | None:
        """The last schedule fraction of ``key`` (None before any report with a peak)."""
        return self._fraction.get(key)

    def peaks(self, key: Hashable) -> list[float]:
        """Each group's peak lr of ``key``."""
        return list(self._peaks.get(key, ()))

    def forget(self, keys: Sequence[Hashable]) -> None:
        """Drop what is kept for these keys (a run that ended)."""
        for k in keys:
            self._peaks.pop(k, None)
            self._last.pop(k, None)
            self._fraction.pop(k, None)
            self._low.pop(k, None)
