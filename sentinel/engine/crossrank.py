"""Compares the ranks of a run with each other, step by step, where data meets.

Two per-rank series come out of it, written when the last rank of a run reports a step:

- ``sentinel_rank_grad_norm_deviation``: for a DDP run (frames with ``ddp``), how far
  each rank's global gradient norm is from the median of all ranks' norms at the same
  step, relative to that median. All-reduced gradients are the same on every rank, bit
  for bit, so anything above rounding means the ranks trained on different gradients: a
  desynchronised rank, or silent data corruption. (With two ranks both deviate equally:
  which one is wrong takes three.)
- ``sentinel_rank_step_time_ratio``: every ``STEP_EVERY`` steps, each rank's median busy
  time over its last ``STEP_WINDOW`` steps (data loading plus forward, before the gradient sync: the frame's
  ``busy_seconds``, else its step time) over the median of the other ranks' medians. In
  lockstep training the step times are equal, so the straggler shows in the time it
  spends before the sync while the others wait for it.

Nothing here adds a collective: it only reads what each rank sends anyway. Memory is
bounded: a few pending steps per run, a few runs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

from sentinel.rules.base import median
from sentinel.store import Labels, Store

DEVIATION = "sentinel_rank_grad_norm_deviation"
STEP_RATIO = "sentinel_rank_step_time_ratio"
METRICS = (DEVIATION, STEP_RATIO)

STEP_WINDOW = 20
"""Steps whose busy times give each rank's median."""
STEP_EVERY = 5
"""Steps between two straggler comparisons (medians move slowly; each costs ~3 µs a rank)."""
MIN_SECONDS = 0.005
"""Busy medians are floored at this when divided, so that 1 ms against 3 ms of nothing
does not read as a 3× straggler."""
PENDING_STEPS = 8
MAX_RUNS = 64
MAX_WORLD = 4096


class _Run:
    __slots__ = ("pending", "busy")

    def __init__(self) -> None:
        # step -> {rank: (global grad norm or None, ddp)}: the ranks heard from for that step
        self.pending: dict[int, dict[int, float | None]] = {}
        self.busy: dict[int, deque[float]] = {}


class CrossRank:
    """Collects what the ranks of each run report for a step; compares them when all are in.

    Args:
        store: where the two series go.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._runs: dict[tuple[str, str, str], _Run] = {}

    def observe(self, f: dict[str, Any], labels_of_rank: Callable[[int], Labels], norm: float | None) -> list[int]:
        """Record one step frame; returns the ranks whose cross-rank series got a sample
        at this frame's step (empty until the last rank of the step reports).

        Args:
            f: the decoded step frame (``world`` > 1 for anything to happen).
            labels_of_rank: the label set of a rank of this frame's run.
            norm: the frame's global gradient norm, if it has one.
        """
        world = f.get("world")
        if not isinstance(world, int) or not 1 < world <= MAX_WORLD:
            return []
        key = (f["job"], f["run"], f.get("opt", ""))  # an optimizer stream meets its own kind only
        run = self._runs.get(key)
        if run is None:
            if len(self._runs) >= MAX_RUNS:
                self._runs.pop(next(iter(self._runs)))  # the oldest run
            run = self._runs[key] = _Run()
        rank, step = f["rank"], f["step"]
        busy = f.get("busy_seconds", f.get("step_seconds"))
        if isinstance(busy, (int, float)) and math.isfinite(busy) and busy >= 0:
            q = run.busy.get(rank)
            if q is None:
                q = run.busy[rank] = deque(maxlen=STEP_WINDOW)
            q.append(float(busy))
        heard = run.pending.get(step)
        if heard is None:
            if len(run.pending) >= PENDING_STEPS:
                run.pending.pop(min(run.pending))  # a step some rank never reported
            heard = run.pending[step] = {}
        heard[rank] = norm if f.get("ddp") else None
        if len(heard) < world:
            return []
        del run.pending[step]
        for old in [s for s in run.pending if s < step]:
            del run.pending[old]
        t = float(f["t"])
        wrote = self._deviation(heard, labels_of_rank, step, t)
        if step % STEP_EVERY == 0:
            wrote = self._straggler(run, labels_of_rank, step, t) or wrote
        return sorted(heard) if wrote else []

    def _deviation(self, norms: dict[int, float | None], labels_of_rank: Callable[[int], Labels],
                   step: int, t: float) -> bool:
        vals = [v for v in norms.values() if v is not None and math.isfinite(v)]
        if len(vals) < 2 or len(vals) < len(norms):
            return False  # not DDP, or a non-finite norm (the non-finite rule's)
        mid = median(vals)
        rows = [(labels_of_rank(r), abs(v - mid) / mid if mid > 0 else (0.0 if v == mid else math.inf))
                for r, v in norms.items() if v is not None]
        for labels, value in rows:
            self.store.add(DEVIATION, labels, step, t, value)
        return True

    def _straggler(self, run: _Run, labels_of_rank: Callable[[int], Labels], step: int, t: float) -> bool:
        medians = {r: median(q) for r, q in run.busy.items() if len(q) >= STEP_WINDOW // 2}
        if len(medians) < 2:
            return False
        for r, m in medians.items():
            others = median([v for k, v in medians.items() if k != r])
            self.store.add(STEP_RATIO, labels_of_rank(r), step, t, m / max(others, MIN_SECONDS))
        return True
