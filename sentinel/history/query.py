"""Reading the history file: runs, a run's series and alerts (for ``runs``, ``report``, ``compare``)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from sentinel.history.values import COLUMNS, optimizer_label, unpack_groups


@dataclass
class RunInfo:
    """One row of ``runs``, decoded."""

    id: int
    job: str
    run: str
    host: str | None
    command: str | None
    ranks: int
    started: float | None
    ended: float | None
    last_seen: float | None
    exit_status: int | None
    state: str
    optimizer: list[dict[str, Any]] | None
    tags: dict[str, str]
    groups: list[str]
    env: dict[str, Any] | None
    steps: int
    first_loss: float | None
    final_loss: float | None
    min_loss: float | None
    nonfinite: bool
    mean_grad_norm: float | None
    mean_delta_norm: float | None
    peak_memory: float | None
    stride: int
    attempt: int = 1
    """The how-manieth run recorded under this job and name (from 1)."""
    attempts: int = 1
    """Runs recorded under this job and name in the file."""
    alerts: dict[str, int] = field(default_factory=dict)
    """Firing transitions by severity."""

    @property
    def label(self) -> str:
        """The run's name, with ``@attempt`` when the name was used more than once."""
        return self.run if self.attempts <= 1 else f"{self.run}@{self.attempt}"

    @property
    def optimizer_name(self) -> str:
        return optimizer_label(self.optimizer, self.tags)

    @property
    def duration(self) -> float | None:
        end = self.ended or self.last_seen
        return end - self.started if end is not None and self.started is not None else None


_RUN_COLS = ("id, job, run, host, command, ranks, started, ended, last_seen, exit_status, state, optimizer, tags, "
             "groups, env, steps, first_loss, final_loss, min_loss, nonfinite, grad_norm_sum, grad_norm_n, "
             "delta_sum, delta_n, peak_memory, stride, attempt, "
             "(SELECT MAX(o.attempt) FROM runs o WHERE o.job = runs.job AND o.run = runs.run)")


def _info(row: tuple[Any, ...]) -> RunInfo:
    (rid, job, run, host, cmd, ranks, started, ended, seen, status, state, opt, tags, groups, env, steps,
     first, final, best, nonfinite, gsum, gn, dsum, dn, peak, stride, attempt, attempts) = row
    return RunInfo(rid, job, run, host, cmd, ranks, started, ended, seen, status, state,
                   json.loads(opt) if opt else None, json.loads(tags) if tags else {},
                   json.loads(groups) if groups else [], json.loads(env) if env else None, steps, first, final,
                   best, bool(nonfinite), gsum / gn if gn else None, dsum / dn if dn else None, peak, stride,
                   attempt, attempts or attempt)


def _alert_counts(db: sqlite3.Connection, runs: list[RunInfo]) -> None:
    by_id = {r.id: r for r in runs}
    for rid, sev, n in db.execute("SELECT run_id, severity, COUNT(*) FROM alerts WHERE state_to = 'firing' "
                                  "GROUP BY run_id, severity"):
        if rid in by_id:
            by_id[rid].alerts[sev] = n


def parse_since(value: str) -> float:
    """``--since``: seconds (``90s``), minutes, hours or days (``2d``) ago, or an ISO date,
    as a Unix time.

    Raises:
        ValueError: none of those.
    """
    import time
    from datetime import datetime

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if value[-1:] in units and value[:-1].replace(".", "", 1).isdigit():
            return time.time() - float(value[:-1]) * units[value[-1]]
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise ValueError(f"expected e.g. 90s, 30m, 12h, 7d or 2026-11-30; got {value!r}") from None


def list_runs(db: sqlite3.Connection, job: str | None = None, tags: dict[str, str] | None = None,
              since: float | None = None, limit: int = 1000) -> list[RunInfo]:
    """Runs, newest first, filtered by job, tags (all must match) and start time."""
    sql, args = f"SELECT {_RUN_COLS} FROM runs WHERE 1=1", []  # type: tuple[str, list[Any]]
    if job:
        sql += " AND job = ?"
        args.append(job)
    if since is not None:
        sql += " AND started >= ?"
        args.append(since)
    sql += " ORDER BY started DESC, id DESC"
    runs = [_info(r) for r in db.execute(sql, args)]
    if tags:
        runs = [r for r in runs if all(r.tags.get(k) == v for k, v in tags.items())]
    runs = runs[:limit]
    _alert_counts(db, runs)
    return runs


def find_run(db: sqlite3.Connection, name: str) -> RunInfo | None:
    """A run by name, the latest run of that name by default.

    ``name`` is ``RUN`` or ``JOB/RUN`` (the latest run of the name; of the latest job if
    several jobs use it), ``RUN@N`` or ``JOB/RUN@N`` (the N-th run recorded under the name,
    from 1: ``@1`` is the first), or ``#ID`` (the id ``sentinel runs`` shows).
    """
    latest = "ORDER BY COALESCE(started, 0) DESC, id DESC LIMIT 1"
    row = None
    if name.startswith("#") and name[1:].isdigit():
        row = db.execute(f"SELECT {_RUN_COLS} FROM runs WHERE id = ?", (int(name[1:]),)).fetchone()
    else:
        wanted: list[tuple[str, int | None]] = [(name, None)]  # a name with an "@" of its own first
        base, at, n = name.rpartition("@")
        if at and base and n.isdigit():
            wanted.append((base, int(n)))
        for which, attempt in wanted:
            row = _by_name(db, which, attempt, latest)
            if row is not None:
                break
    if row is None:
        return None
    info = _info(row)
    _alert_counts(db, [info])
    return info


def _by_name(db: sqlite3.Connection, name: str, attempt: int | None, latest: str) -> tuple[Any, ...] | None:
    which, args = ("", ()) if attempt is None else (" AND attempt = ?", (attempt,))
    row = db.execute(f"SELECT {_RUN_COLS} FROM runs WHERE run = ?{which} {latest}", (name, *args)).fetchone()
    if row is None and "/" in name:
        job, _, run = name.partition("/")
        row = db.execute(f"SELECT {_RUN_COLS} FROM runs WHERE job = ? AND run = ?{which} {latest}",
                         (job, run, *args)).fetchone()
    return row  # type: ignore[no-any-return]


@dataclass
class Series:
    """A run's kept samples: ``steps`` and one list per column (None: not recorded at that step)."""

    steps: list[int]
    columns: dict[str, list[float | None]]
    group_grad: list[list[float]]  # per kept step, per group (NaN: not sent)
    group_param: list[list[float]]
    group_ratio: list[list[float]]
    group_steps: list[int]
    """The steps of the ``group_*`` rows."""


def series(db: sqlite3.Connection, run: RunInfo) -> Series:
    """Every kept sample of a run, in step order."""
    n = len(run.groups)
    out = Series([], {c: [] for c in COLUMNS}, [], [], [], [])
    for row in db.execute(f"SELECT step, {', '.join(COLUMNS)}, groups FROM samples WHERE run_id = ? ORDER BY step",
                          (run.id,)):
        out.steps.append(row[0])
        for c, v in zip(COLUMNS, row[1:-1]):
            out.columns[c].append(v)
        g = unpack_groups(row[-1], n)
        if g is not None:
            out.group_grad.append(g[0])
            out.group_param.append(g[1])
            out.group_ratio.append(g[2])
            out.group_steps.append(row[0])
    return out


def alerts(db: sqlite3.Connection, run: RunInfo) -> list[dict[str, Any]]:
    """The run's alert transitions, in order."""
    cols = ("alertname", "severity", "state_from", "state_to", "step", "time", "value", "threshold", "summary",
            "causes", "checks", "ranks", "groups")
    out = []
    for row in db.execute(f"SELECT {', '.join(cols)} FROM alerts WHERE run_id = ? ORDER BY id", (run.id,)):
        d = dict(zip(cols, row))
        for k in ("causes", "checks", "ranks", "groups"):
            d[k] = json.loads(d[k]) if d[k] else []
        out.append(d)
    return out


def steps_to_target(db: sqlite3.Connection, run: RunInfo, target: float) -> int | None:
    """The first step whose loss was at or below ``target`` (from the loss minima, exact)."""
    row = db.execute("SELECT MIN(step) FROM loss_records WHERE run_id = ? AND loss <= ?", (run.id, target)).fetchone()
    return int(row[0]) if row and row[0] is not None else None
