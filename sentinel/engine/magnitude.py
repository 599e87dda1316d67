"""The update's size: ‖Δw‖ (seed 004 §2.3, §4.3) and the seed's UAR, mean|Δw| / mean|w|
(seed 000 §4.4), beside the L2 ratio ‖Δw‖/‖w‖ that :func:`~sentinel.engine.derived.write_update_ratios`
writes. All come from the same sampled snapshot of the groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sentinel.store import Labels, Store

Row = tuple[Labels, float]


def _sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 else float("nan")


def write_update_norms(store: Store, labels: tuple[Labels, ...], dsq: Sequence[float | None],
                       step: int, t: float) -> float | None:
    """Write ``sentinel_group_update_norm`` (‖Δw‖ per sampled group); return the norm
    over the sampled groups, or None when none was sampled."""
    rows: list[Row] = []
    total, any_ = 0.0, False
    for ls, d in zip(labels, dsq):
        if isinstance(d, (int, float)):
            rows.append((ls, _sqrt(float(d))))
            total += float(d)
            any_ = True
    _write(store, "sentinel_group_update_norm", labels, rows, step, t)
    return _sqrt(total) if any_ else None


def write_mean_abs_ratios(store: Store, labels: tuple[Labels, ...], dl1: object, pl1: object,
                          step: int, t: float) -> float | None:
    """Write ``sentinel_group_update_mean_abs_ratio`` (sum|Δw| / sum|w| of a sampled group,
    which is mean|Δw| / mean|w| over its elements); return the ratio over the sampled
    groups, or None (no L1 sums in the frame, or a zero weight sum)."""
    if not isinstance(dl1, list) or not isinstance(pl1, list) or len(dl1) != len(labels) or len(pl1) != len(labels):
        return None
    rows: list[Row] = []
    num = den = 0.0
    for ls, d, p in zip(labels, dl1, pl1):
        if not isinstance(d, (int, float)) or not isinstance(p, (int, float)):
            continue
        num += float(d)
        den += float(p)
        if p > 0:
            rows.append((ls, float(d) / float(p)))
    _write(store, "sentinel_group_update_mean_abs_ratio", labels, rows, step, t)
    return num / den if den > 0 else None


def _write(store: Store, name: str, labels: tuple[Labels, ...], rows: list[Row], step: int, t: float) -> None:
    """Every group at once as one block row (``labels`` is the rank's cached tuple), else
    the sampled groups one by one (a rotating snapshot)."""
    if len(rows) == len(labels) and rows:
        store.add_row(name, labels, [v for _, v in rows], step, t)
    elif rows:
        store.add_many(name, rows, step, t)
