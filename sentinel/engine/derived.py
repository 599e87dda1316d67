"""Quantities derived from the sums of squares a frame carries: norms, update ratios, GVR.

Shared by the ingest of a rank's own frame and by the assembly of sharded ranks' sums.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Sequence

import numpy as np

from sentinel.store import Labels, Store

GVR_WINDOW = 50
"""Recent finite global grad norms the gradient variance ratio is taken over."""


def sqrt(x: float) -> float:
    """``√x``; NaN for a negative sum of squares (a malformed frame), NaN stays NaN."""
    return math.sqrt(x) if x >= 0 or math.isnan(x) else float("nan")


def group_norms(sumsq: Sequence[float], groups: Sequence[str], total: float) -> tuple[np.ndarray, list[str]]:
    """Per-group norms from sums of squares (NaN for a negative sum), and the groups whose
    sum is not finite, in order. ``total`` is their (exact) sum: when it is finite and no
    sum is negative, nothing needs checking one by one."""
    a = np.asarray(sumsq, dtype=np.float64)
    if math.isfinite(total) and min(sumsq, default=0.0) >= 0.0:
        return np.sqrt(a), []
    norms = np.sqrt(np.abs(a))
    norms[a < 0.0] = np.nan
    fin = np.isfinite(a)
    return norms, [groups[i] for i in np.flatnonzero(~fin).tolist()]


class GroupLabels:
    """The label set of each group series of a rank, built once per rank and group list:
    the same tuple object each time, which :meth:`Store.add_row` keys its blocks by."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._rows: dict[tuple[Labels, tuple[str, ...]], tuple[Labels, ...]] = {}

    def __call__(self, base: Labels, groups: Sequence[str]) -> tuple[Labels, ...]:
        key = (base, tuple(groups))
        out = self._rows.get(key)
        if out is None:
            if len(self._rows) > self.limit:
                self._rows.clear()
            out = self._rows[key] = tuple(tuple(sorted(base + (("group", g),))) for g in groups)
        return out


def write_update_ratios(store: Store, base: Labels, labels: tuple[Labels, ...], psq: Sequence[float],
                        dsq: Sequence[float | None], step: int, t: float) -> float | None:
    """Write ``sentinel_group_update_ratio`` (‖Δw‖/‖w‖ per group) and return the global
    ratio, or None when no parameter norm is known.

    Groups whose Δw was not sampled at this step (``None``) or whose ‖w‖ is 0 get no
    sample. When every group has one, the row is written as one block.
    """
    num = den = 0.0
    rows = []
    for ls, p, d in zip(labels, psq, dsq):
        if d is None:
            continue
        num += d
        den += p
        if p > 0:  # ||w|| = 0: no ratio for this group
            rows.append((ls, sqrt(d) / sqrt(p)))
    if len(rows) == len(labels):
        store.add_row("sentinel_group_update_ratio", labels, [v for _, v in rows], step, t)
    else:
        store.add_many("sentinel_group_update_ratio", rows, step, t)
    return sqrt(num) / sqrt(den) if den > 0 else None


class GvrTracker:
    """The gradient variance ratio, var/mean² of the last ``window`` finite global grad
    norms, per key (a rank), in O(1) per value: running sums, recomputed exactly once
    every ``window`` values so rounding cannot drift.

    Args:
        window: values kept per key.
        max_keys: keys kept (the oldest is forgotten first).
    """

    def __init__(self, window: int = GVR_WINDOW, max_keys: int = 10_000) -> None:
        self.window = window
        self.max_keys = max_keys
        self._state: dict[Hashable, tuple[deque[float], list[float]]] = {}

    def forget(self, key: Hashable) -> None:
        """Drop what is kept for ``key``."""
        self._state.pop(key, None)

    def push(self, key: Hashable, value: float) -> float | None:
        """Add one norm (a non-finite one is skipped); the ratio, or None with fewer than
        10 values or a mean of 0."""
        st = self._state.get(key)
        if st is None:
            if len(self._state) >= self.max_keys:
                self._state.pop(next(iter(self._state)))
            st = self._state[key] = (deque(maxlen=self.window), [0.0, 0.0, 0.0])  # s1, s2, pushes
        vals, sums = st
        if math.isfinite(value):
            if len(vals) == self.window:
                old = vals[0]
                sums[0] -= old
                sums[1] -= old * old
            vals.append(value)
            sums[0] += value
            sums[1] += value * value
            sums[2] += 1
            if sums[2] >= self.window:
                sums[0], sums[1], sums[2] = math.fsum(vals), math.fsum(v * v for v in vals), 0.0
        n = len(vals)
        if n < 10:
            return None
        mean = sums[0] / n
        if mean <= 0:
            return None
        return max(0.0, sums[1] / n - mean * mean) / (mean * mean)
