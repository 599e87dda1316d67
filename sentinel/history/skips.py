"""The step guard's skip list in the run history (table ``skips``, schema v4), and its
text form for ``sentinel skips RUN``.

One row per skipped step and rank: the reason, the norm against its bound, the groups that
held non-finite values, the batch index where the script or adapter told it, and the
``max_consecutive`` outcome where it was reached. Rows are written by the history's writer
from the guard notes (``log`` frames carrying ``guard``, see :class:`sentinel.wire.GuardNote`).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

SCHEMA = """
CREATE TABLE skips (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    time REAL,
    reason TEXT,
    norm REAL,
    bound REAL,
    groups TEXT,
    batch INTEGER,
    consecutive INTEGER,
    outcome TEXT,
    skipped INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (run_id, rank, step)
) WITHOUT ROWID;
"""


def record(db: sqlite3.Connection, run_id: int, f: dict[str, Any]) -> None:
    """Write the guard note of frame ``f`` (a skip, or an outcome) for run ``run_id``.

    The note of an applied step after skips (nothing skipped, no outcome) is not a row."""
    g = f["guard"]
    if not g.get("skipped") and not g.get("outcome"):
        return
    db.execute("INSERT OR REPLACE INTO skips VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
               (run_id, int(f["rank"]), int(f["step"]), float(f["t"]), str(g.get("reason", "")),
                _real(g.get("norm")), _real(g.get("bound")), json.dumps(list(g.get("groups") or [])),
                g.get("batch"), int(g.get("consecutive", 0)), str(g.get("outcome", "")), int(bool(g.get("skipped")))))


def _real(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if x == x else None  # NaN is stored as NULL


@dataclass(frozen=True)
class Skip:
    """One skipped step (or outcome) of one rank."""

    rank: int
    step: int
    reason: str
    norm: float | None
    bound: float | None
    groups: tuple[str, ...]
    batch: int | None
    consecutive: int
    outcome: str
    skipped: bool


def skips_of(db: sqlite3.Connection, run_id: int) -> list[Skip]:
    """The run's skip rows, by step then rank (an older file without the table: none)."""
    try:
        rows = db.execute("SELECT rank, step, reason, norm, bound, groups, batch, consecutive, outcome, skipped "
                          "FROM skips WHERE run_id = ? ORDER BY step, rank", (run_id,)).fetchall()
    except sqlite3.OperationalError:
        return []
    return [Skip(int(r[0]), int(r[1]), r[2] or "", r[3], r[4], tuple(json.loads(r[5] or "[]")), r[6],
                 int(r[7] or 0), r[8] or "", bool(r[9])) for r in rows]


def text(skips: list[Skip], label: str) -> str:
    """``sentinel skips RUN``: a header, one line per skip, and the lists a restart can use."""
    if not skips:
        return f"{label}: no step was skipped by the guard (or the guard was off)"
    lines = [f"{label}: {sum(s.skipped for s in skips)} skipped step(s)",
             "step  rank  reason     norm        bound       batch  groups"]
    for s in skips:
        norm = "nan" if s.norm is None else f"{s.norm:.4g}"
        bound = "—" if s.bound is None else f"{s.bound:.4g}"
        batch = "—" if s.batch is None else str(s.batch)
        what = s.reason if s.skipped else "(let through)"
        extra = f"  [{s.outcome}]" if s.outcome else ""
        lines.append(f"{s.step:<5} {s.rank:<5} {what:<10} {norm:<11} {bound:<11} {batch:<6} "
                     f"{', '.join(s.groups) or '—'}{extra}")
    steps = sorted({s.step for s in skips if s.skipped})
    batches = sorted({s.batch for s in skips if s.skipped and s.batch is not None})
    lines.append("skip steps: " + ",".join(map(str, steps)))
    lines.append("skip batches: " + (",".join(map(str, batches)) if batches else
                                     "not exposed (the script's DataLoader position was not told to the guard: "
                                     "mon.guard.note_batch(i), or the Lightning/HF adapters)"))
    return "\n".join(lines)
