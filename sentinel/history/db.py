"""The run history file: one SQLite database (WAL), versioned and migrated in steps.

Tables:

- ``schema_version``: one row, the version the file is at (:data:`SCHEMA_VERSION`);
- ``runs``: one row per run: identity (job, run name and ``attempt``, the how-manieth run
  recorded under that job and name, from 1), command, host, times, exit status, state,
  optimizer and tags (JSON), and running aggregates that thinning never touches (steps,
  first/final/min loss, grad-norm and ‖Δw‖ sums, peak memory, non-finite flag);
- ``samples``: the model's values, one row per kept step (rank 0's frame; for a sharded run
  the norms are the whole model's, assembled from every rank's sums by the engine; the
  ``groups`` blob holds the per-group grad norms, parameter norms and update ratios as
  float32, 3 × groups);
- ``loss_records``: every step at which the loss reached a new minimum (exact "steps to
  target" for any target, whatever thinning did to ``samples``);
- ``alerts``: every alert transition;
- ``skips``: the steps the step guard kept out of the weights (:mod:`sentinel.history.skips`).

A file is never recreated: an older one is migrated step by step (:data:`MIGRATIONS`), a
newer one (from a later sentinel) is refused, which the recorder turns into "no history".
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from sentinel.files import private_sqlite
from sentinel.history.skips import SCHEMA as SKIPS_SCHEMA

SCHEMA_VERSION = 5

_V1 = """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    job TEXT NOT NULL,
    run TEXT NOT NULL,
    host TEXT,
    command TEXT,
    ranks INTEGER NOT NULL DEFAULT 0,
    world INTEGER,
    started REAL,
    ended REAL,
    last_seen REAL,
    exit_status INTEGER,
    state TEXT NOT NULL DEFAULT 'running',
    optimizer TEXT,
    tags TEXT,
    groups TEXT,
    steps INTEGER NOT NULL DEFAULT 0,
    first_loss REAL,
    final_loss REAL,
    min_loss REAL,
    nonfinite INTEGER NOT NULL DEFAULT 0,
    grad_norm_sum REAL NOT NULL DEFAULT 0,
    grad_norm_n INTEGER NOT NULL DEFAULT 0,
    delta_sum REAL NOT NULL DEFAULT 0,
    delta_n INTEGER NOT NULL DEFAULT 0,
    peak_memory REAL,
    stride INTEGER NOT NULL DEFAULT 1,
    samples INTEGER NOT NULL DEFAULT 0,
    UNIQUE (job, run)
);
CREATE INDEX runs_started ON runs (started);
CREATE TABLE samples (
    run_id INTEGER NOT NULL,
    step INTEGER NOT NULL,
    t REAL,
    loss REAL, grad_norm REAL, clip_norm REAL, param_norm REAL, update_ratio REAL, delta_norm REAL,
    lr REAL, mem_used REAL, mem_peak REAL, loss_scale REAL, step_seconds REAL,
    groups BLOB,
    PRIMARY KEY (run_id, step)
) WITHOUT ROWID;
CREATE TABLE loss_records (
    run_id INTEGER NOT NULL,
    step INTEGER NOT NULL,
    loss REAL NOT NULL,
    PRIMARY KEY (run_id, step)
) WITHOUT ROWID;
CREATE TABLE alerts (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL,
    alertname TEXT NOT NULL,
    severity TEXT NOT NULL,
    state_from TEXT, state_to TEXT NOT NULL,
    step INTEGER, time REAL, value REAL, threshold REAL,
    summary TEXT, causes TEXT, checks TEXT, ranks TEXT, groups TEXT
);
CREATE INDEX alerts_run ON alerts (run_id);
"""

_RUN_COLUMNS = ("id, job, run, host, command, ranks, world, started, ended, last_seen, exit_status, state, "
                "optimizer, tags, groups, steps, first_loss, final_loss, min_loss, nonfinite, grad_norm_sum, "
                "grad_norm_n, delta_sum, delta_n, peak_memory, stride, samples, env")

# v3: a run name used again under a job is a new run (a new row), numbered by ``attempt``;
# SQLite cannot drop the old UNIQUE (job, run), so the table is rebuilt (ids kept: the
# samples, loss records and alerts still point at their runs)
_V3 = f"""
CREATE TABLE runs_v3 (
    id INTEGER PRIMARY KEY,
    job TEXT NOT NULL,
    run TEXT NOT NULL,
    host TEXT,
    command TEXT,
    ranks INTEGER NOT NULL DEFAULT 0,
    world INTEGER,
    started REAL,
    ended REAL,
    last_seen REAL,
    exit_status INTEGER,
    state TEXT NOT NULL DEFAULT 'running',
    optimizer TEXT,
    tags TEXT,
    groups TEXT,
    steps INTEGER NOT NULL DEFAULT 0,
    first_loss REAL,
    final_loss REAL,
    min_loss REAL,
    nonfinite INTEGER NOT NULL DEFAULT 0,
    grad_norm_sum REAL NOT NULL DEFAULT 0,
    grad_norm_n INTEGER NOT NULL DEFAULT 0,
    delta_sum REAL NOT NULL DEFAULT 0,
    delta_n INTEGER NOT NULL DEFAULT 0,
    peak_memory REAL,
    stride INTEGER NOT NULL DEFAULT 1,
    samples INTEGER NOT NULL DEFAULT 0,
    env TEXT,
    attempt INTEGER NOT NULL DEFAULT 1
);
INSERT INTO runs_v3 ({_RUN_COLUMNS}, attempt) SELECT {_RUN_COLUMNS}, 1 FROM runs;
DROP TABLE runs;
ALTER TABLE runs_v3 RENAME TO runs;
CREATE INDEX runs_started ON runs (started);
CREATE UNIQUE INDEX runs_attempt ON runs (job, run, attempt);
"""

_V5 = """
CREATE TABLE stream_samples (
    run_id INTEGER NOT NULL,
    stream TEXT NOT NULL,
    step INTEGER NOT NULL,
    t REAL,
    loss REAL, grad_norm REAL, clip_norm REAL, param_norm REAL, update_ratio REAL, delta_norm REAL,
    lr REAL, mem_used REAL, mem_peak REAL, loss_scale REAL, step_seconds REAL,
    groups BLOB,
    PRIMARY KEY (run_id, stream, step)
) WITHOUT ROWID;
"""

MIGRATIONS: dict[int, str] = {
    1: _V1,
    # v2: the environment record (a frame's ``env`` map), shown by the report
    2: "ALTER TABLE runs ADD COLUMN env TEXT;",
    3: _V3,
    # v4: the step guard's skip list (sentinel/history/skips.py)
    4: SKIPS_SCHEMA,
    # v5: the samples of a process's further optimizer streams (a GAN's second optimizer,
    # ``optimizer="1"``, ...); ``samples`` holds the first (or only) one's
    5: _V5,
}
"""``version → script`` that brings a file from ``version - 1`` to ``version``."""


class NewerSchema(sqlite3.DatabaseError):
    """The file was written by a later sentinel (its schema is newer than this one's)."""


def default_path() -> Path:
    """``$XDG_STATE_HOME/sentinel/history.sqlite``, else ``~/.local/state/sentinel/history.sqlite``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "sentinel" / "history.sqlite"


def version_of(db: sqlite3.Connection) -> int:
    """The file's schema version (0: a new, empty file)."""
    has = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'").fetchone()
    if not has:
        return 0
    row = db.execute("SELECT version FROM schema_version").fetchone()
    return int(row[0]) if row else 0


def migrate(db: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring the file to ``target`` one step at a time, each step in its own transaction,
    which reads the version again under the write lock: two processes opening a new file at
    once (two engines started together) take each step once, and the second goes on with
    the file the first made (it failed on ``table runs already exists`` and recorded no
    history for its whole run).

    Returns:
        The version the file was at before.

    Raises:
        NewerSchema: the file is at a later version than ``target``.
        sqlite3.Error: the file is not a database, or a step failed (that step is rolled back).
    """
    before = version_of(db)
    if before > target:
        raise NewerSchema(f"history schema {before} is newer than this sentinel's ({target})")
    for version in range(before + 1, target + 1):
        script = MIGRATIONS[version]
        db.execute("BEGIN IMMEDIATE")
        try:
            if version_of(db) >= version:  # another process took the file there since (two engines at once)
                db.execute("COMMIT")
                continue
            for statement in (s.strip() for s in script.split(";")):
                if statement:
                    db.execute(statement)
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            db.execute("DELETE FROM schema_version")
            db.execute("INSERT INTO schema_version VALUES (?)", (version,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return before


def _wal(db: sqlite3.Connection, timeout: float) -> None:
    """Put the file in WAL mode. The switch does not wait for a lock as statements do: while
    another process makes the file's tables (two engines opening a new file at once), it
    fails at once with ``database is locked``, so it is tried again until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def connect(path: str | Path, *, readonly: bool = False, timeout: float = 2.0) -> sqlite3.Connection:
    """Open (and for writing, create and migrate) the history file.

    Args:
        readonly: open for the CLI's queries: nothing is created; a file of an older schema
            is migrated first (opened for writing once), then opened read-only.
        timeout: how long a statement waits for a lock before ``database is locked``.

    Raises:
        OSError, sqlite3.Error: it cannot be opened, is not a database, is too new, or is
            older and cannot be migrated here (e.g. a read-only copy).
    """
    p = Path(path)
    if readonly:
        if not p.exists():
            raise FileNotFoundError(f"no history file at {p}")
        db = _open_ro(p, timeout)
        v = version_of(db)
        if 0 < v < SCHEMA_VERSION:
            db.close()
            try:
                connect(p, timeout=timeout).close()
            except (OSError, sqlite3.Error) as exc:
                raise sqlite3.DatabaseError(f"history schema {v} is older and cannot be migrated here "
                                            f"({type(exc).__name__}: {exc})") from None
            db = _open_ro(p, timeout)
            v = version_of(db)
        if v != SCHEMA_VERSION:
            db.close()
            raise NewerSchema(f"history schema {v}; this sentinel reads {SCHEMA_VERSION}") if v > SCHEMA_VERSION \
                else sqlite3.DatabaseError(f"history schema {v}: not a sentinel history file")
        return db
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fresh = not p.exists()
    private_sqlite(p)  # before SQLite makes its -wal and -shm files, which take the file's mode
    db = sqlite3.connect(str(p), timeout=timeout, check_same_thread=False, isolation_level=None)
    try:
        if fresh:  # only before the first table: lets retention give pages back to the disk
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        _wal(db, timeout)
        db.execute("PRAGMA synchronous=NORMAL")  # WAL: a committed batch survives a process crash
        db.execute("PRAGMA quick_check(1)").fetchone()  # a corrupt file fails here, not mid-run
        migrate(db)
    except BaseException:
        db.close()
        raise
    return db


def _open_ro(p: Path, timeout: float) -> sqlite3.Connection:
    return sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout, check_same_thread=False,
                           isolation_level=None)


def used_bytes(db: sqlite3.Connection) -> int:
    """Bytes of the file in use (pages not on the free list)."""
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


def enforce_retention(db: sqlite3.Connection, now: float, keep_seconds: float, max_bytes: int) -> int:
    """Delete runs last seen more than ``keep_seconds`` ago, then the oldest runs while the
    file uses more than ``max_bytes`` (the newest run is always kept). Returns runs deleted."""
    gone = [r[0] for r in db.execute("SELECT id FROM runs WHERE COALESCE(last_seen, started, 0) < ?",
                                     (now - keep_seconds,))]
    _delete(db, gone)
    deleted = len(gone)
    while used_bytes(db) > max_bytes:
        rows = db.execute("SELECT id FROM runs ORDER BY COALESCE(last_seen, started, 0) LIMIT 2").fetchall()
        if len(rows) < 2:
            break
        _delete(db, [rows[0][0]])
        deleted += 1
    if deleted:
        db.execute("PRAGMA incremental_vacuum")
    return deleted


def _delete(db: sqlite3.Connection, ids: list[int]) -> None:
    for run_id in ids:
        for table in ("samples", "stream_samples", "loss_records", "alerts", "skips"):
            db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        db.execute("DELETE FROM runs WHERE id = ?", (run_id,))
