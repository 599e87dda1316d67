"""The history recorder: the engine hands it frames and transitions (a bounded queue, no
I/O), a writer thread writes them to the history file in batches.

Bound: each run keeps at most ``max_points`` rows in ``samples`` (rank 0's). A run starts
with every step; each time it would pass ``max_points`` the stride doubles and the rows off
the new stride are deleted, so a run of any length holds between ``max_points / 2`` and
``max_points`` rows (plus its first step). ``loss_records`` holds every new loss minimum for the first ``max_points``, then
those at least 0.1% below the last (4 × ``max_points`` rows at most); the run's aggregates (final loss, means, peak memory)
are exact whatever was thinned.

Never a crash: a file that cannot be opened, is corrupt, locked or full switches the
recorder off ("no history"): ``degraded`` counts it, one line is logged, and frames are
then only counted as dropped. Training never waits for it.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sentinel.history import db as hdb
from sentinel.history.values import COLUMNS, group_blob, optimizer_of, sample, tags_of, transition_row
from sentinel.rules.alert import Transition
from sentinel.store import Row

log = logging.getLogger("sentinel")

_UPSERT = (f"INSERT INTO samples (run_id, step, t, {', '.join(COLUMNS)}, groups) "
           f"VALUES (?, ?, ?, {', '.join('?' * len(COLUMNS))}, ?) ON CONFLICT (run_id, step) DO UPDATE SET "
           + ", ".join(f"{c} = COALESCE(excluded.{c}, {c})" for c in ("t", *COLUMNS, "groups")))


@dataclass(eq=False)
class _Run:
    id: int
    stride: int
    samples: int
    records: int
    best: float | None
    ranks: set[int] = field(default_factory=set)
    byes: set[int] = field(default_factory=set)
    groups: list[str] | None = None
    first_loss: float | None = None
    sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])  # grad sum, n, delta sum, n
    peak: float | None = None
    agg: dict[str, Any] = field(default_factory=dict)  # run columns to write at the batch's end


class Recorder:
    """Records runs, their thinned series and their alerts in the history file.

    Args:
        path: the SQLite file.
        max_points: sample rows kept per run at most (see the module's docstring).
        keep_seconds: runs last seen longer ago than this are deleted.
        max_bytes: past this many bytes in use, the oldest runs are deleted.
        queue_size: items (frames, transitions) waiting for the writer at most; more are
            dropped and counted.
        flush_seconds: the writer commits a batch at least this often.
        clock: wall clock.
    """

    def __init__(self, path: str | Path, max_points: int = 4096, keep_seconds: float = 90 * 86_400.0,
                 max_bytes: int = 2**30, queue_size: int = 65_536, flush_seconds: float = 0.5,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = str(path)
        self.max_points, self.keep_seconds, self.max_bytes = max_points, keep_seconds, max_bytes
        self.queue_size, self.flush_seconds, self.clock = queue_size, flush_seconds, clock
        self.host = socket.gethostname()
        self.degraded = 0
        self.dropped = 0
        self.written = 0  # items written (committed)
        self.batches = 0
        self._offered = 0
        self._taken = 0
        self._queue: deque[tuple[str, Any]] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._runs: dict[tuple[str, str], _Run] = {}
        self._db: sqlite3.Connection | None = None
        try:
            self._db = hdb.connect(self.path)
            hdb.enforce_retention(self._db, clock(), keep_seconds, max_bytes)
        except Exception as exc:
            self._degrade(exc)
        self._thread = threading.Thread(target=self._loop, name="sentinel-history", daemon=True)
        self._thread.start()

    @property
    def up(self) -> bool:
        """Whether history is being written."""
        return self._db is not None

    # -- the engine's side: no I/O, never blocks ----------------------------------------------

    def _offer(self, item: tuple[str, Any]) -> bool:
        if self._db is None or self._offered - self._taken >= self.queue_size:
            self.dropped += 1
            return False
        self._offered += 1
        self._queue.append(item)
        return True

    def offer_frame(self, frame: dict[str, Any]) -> bool:
        """Queue a decoded, admitted frame (an engine frame listener). False if dropped."""
        return self._offer(("frame", frame))

    def offer_transition(self, t: Transition) -> bool:
        """Queue an alert transition (an engine listener)."""
        return self._offer(("alert", t))

    def run_started(self, job: str, run: str, command: str = "", tags: dict[str, str] | None = None) -> None:
        """What ``sentinel run`` knows before any frame: the command and its ``--tag``s."""
        self._offer(("start", (job, run, command, tags or {}, self.clock())))

    def run_ended(self, job: str, run: str, status: int) -> None:
        """The command's exit status (``sentinel run``): 0 finished, else crashed."""
        self._offer(("end", (job, run, status, self.clock())))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is committed; False on timeout or no history."""
        target = self._offered
        deadline = time.monotonic() + timeout
        self._wake.set()
        while self.written + self._lost < target:
            if self._db is None or time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.005)
        return True

    _lost = 0  # taken but not written (an error degraded the file mid-batch)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the writer and close the file."""
        self.flush(timeout)
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    def rows(self) -> Iterator[Row]:
        """The recorder's own metrics, for /metrics."""
        yield ("sentinel_history_up", "gauge", (), 1.0 if self.up else 0.0)
        yield ("sentinel_history_degraded_total", "counter", (), float(self.degraded))
        yield ("sentinel_history_dropped_total", "counter", (), float(self.dropped))
        yield ("sentinel_history_queue_depth", "gauge", (), float(self._offered - self._taken))

    # -- the writer thread -----------------------------------------------------------------------

    def _degrade(self, exc: BaseException) -> None:
        self.degraded += 1
        if self.degraded == 1:
            log.warning("sentinel history: cannot use %s (%s: %s); no run history is recorded from now on "
                        "(sentinel_history_degraded_total); training and alerts go on", self.path,
                        type(exc).__name__, exc)
        db, self._db = self._db, None
        if db is not None:
            try:
                db.close()
            except Exception:
                pass

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.flush_seconds)
            self._wake.clear()
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(4096, len(self._queue)))]
                self._taken += len(batch)
                if self._db is None:
                    self._lost += len(batch)
                    continue
                try:
                    self._write(batch)
                    self.written += len(batch)
                    self.batches += 1
                except Exception as exc:  # corrupt, locked, full: no history, never a crash
                    self._lost += len(batch)
                    self._degrade(exc)
            if self._stop:
                if self._db is not None:
                    self._db.close()
                    self._db = None
                return

    def _write(self, batch: list[tuple[str, Any]]) -> None:
        db = self._db
        assert db is not None
        db.execute("BEGIN IMMEDIATE")
        try:
            touched: set[_Run] = set()
            for kind, item in batch:
                if kind == "frame":
                    touched.add(self._frame(db, item))
                elif kind == "alert":
                    self._alert(db, item)
                elif kind == "start":
                    self._start(db, *item)
                elif kind == "end":
                    self._end(db, *item)
            for r in touched:
                if r.agg:
                    cols = ", ".join(f"{k} = ?" for k in r.agg)
                    db.execute(f"UPDATE runs SET {cols} WHERE id = ?", (*r.agg.values(), r.id))
                    r.agg = {}
            if self.batches % 1000 == 999:
                hdb.enforce_retention(db, self.clock(), self.keep_seconds, self.max_bytes)
            db.execute("COMMIT")
        except BaseException:
            self._runs.clear()  # the in-memory view may be ahead of the file: reload it
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise

    def _run(self, db: sqlite3.Connection, job: str, run: str, t: float) -> _Run:
        r = self._runs.get((job, run))
        if r is not None:
            return r
        db.execute("INSERT OR IGNORE INTO runs (job, run, host, started, last_seen) VALUES (?, ?, ?, ?, ?)",
                   (job, run, self.host, t, t))
        row = db.execute("SELECT id, stride, samples, min_loss, ranks, groups, first_loss, grad_norm_sum, "
                         "grad_norm_n, delta_sum, delta_n, peak_memory FROM runs WHERE job = ? AND run = ?",
                         (job, run)).fetchone()
        records = db.execute("SELECT COUNT(*) FROM loss_records WHERE run_id = ?", (row[0],)).fetchone()[0]
        r = _Run(row[0], row[1], row[2], records, row[3], set(range(row[4] or 0)),
                 groups=json.loads(row[5]) if row[5] else None, first_loss=row[6],
                 sums=[float(x) for x in row[7:11]], peak=row[11])
        if len(self._runs) > 1000:
            self._runs.clear()
        self._runs[(job, run)] = r
        return r

    def _frame(self, db: sqlite3.Connection, f: dict[str, Any]) -> _Run:
        t = float(f["t"])
        r = self._run(db, f["job"], f["run"], t)
        rank, step, kind = f["rank"], f["step"], f["kind"]
        agg = r.agg
        agg["last_seen"] = t
        if rank not in r.ranks:
            r.ranks.add(rank)
            agg["ranks"] = len(r.ranks)
            if isinstance(f.get("world"), int):
                agg["world"] = f["world"]
        if kind == "bye":
            r.byes.add(rank)
            agg["ended"] = t
            if isinstance(f.get("exc"), str):
                agg["state"], agg["exit_status"] = "crashed", 1
            elif r.byes >= r.ranks:
                db.execute("UPDATE runs SET state = 'finished' WHERE id = ? AND state = 'running'", (r.id,))
            return r
        r.byes.discard(rank)
        for key, conv, col in (("tags", tags_of, "tags"), ("optimizer", optimizer_of, "optimizer")):
            if key in f:
                value = conv(f[key])
                if value is not None:
                    agg[col] = json.dumps(value)
        if isinstance(f.get("cmd"), str):
            db.execute("UPDATE runs SET command = ? WHERE id = ? AND command IS NULL", (f["cmd"][:1000], r.id))
        if isinstance(f.get("env"), dict):
            agg["env"] = json.dumps(f["env"], default=str)[:20_000]
        if rank != 0:
            return r
        vals = sample(f)
        if kind == "step":
            agg["steps"] = step
            groups = f.get("groups")
            if isinstance(groups, list) and groups != r.groups:
                r.groups = list(groups)
                agg["groups"] = json.dumps(r.groups)
        self._aggregate(db, r, step, vals)
        if not vals:
            return r
        if step > 1 and step % r.stride:
            return r  # off the stride: only the aggregates count it
        blob = group_blob(f)
        db.execute(_UPSERT, (r.id, step, t, *(vals.get(c) for c in COLUMNS), blob))
        if kind == "step":
            r.samples += 1
            if r.samples > self.max_points:
                self._thin(db, r)
            agg["samples"], agg["stride"] = r.samples, r.stride
        return r

    def _aggregate(self, db: sqlite3.Connection, r: _Run, step: int, vals: dict[str, float | None]) -> None:
        """The run's exact aggregates, kept in memory and written once per batch."""
        agg = r.agg
        loss = vals.get("loss")
        if loss is not None:
            agg["final_loss"] = loss
            if not math.isfinite(loss):
                agg["nonfinite"] = 1
            else:
                if r.first_loss is None:
                    r.first_loss = agg["first_loss"] = loss
                # every new minimum for the first max_points; then only those 0.1% below the
                # last (steps to a target stay within 0.1% of its loss), 4 × max_points at most
                if (r.best is None or loss < (r.best if r.records < self.max_points else r.best * 0.999)) \
                        and r.records < 4 * self.max_points:
                    r.best = agg["min_loss"] = loss
                    r.records += 1
                    db.execute("INSERT OR REPLACE INTO loss_records VALUES (?, ?, ?)", (r.id, step, loss))
        g = vals.get("grad_norm")
        if g is not None:
            if math.isfinite(g):
                r.sums[0] += g
                r.sums[1] += 1
                agg["grad_norm_sum"], agg["grad_norm_n"] = r.sums[0], int(r.sums[1])
            else:
                agg["nonfinite"] = 1
        d = vals.get("delta_norm")
        if d is not None and math.isfinite(d):
            r.sums[2] += d
            r.sums[3] += 1
            agg["delta_sum"], agg["delta_n"] = r.sums[2], int(r.sums[3])
        peak = vals.get("mem_peak")
        if peak is not None and (r.peak is None or peak > r.peak):
            r.peak = agg["peak_memory"] = peak

    def _thin(self, db: sqlite3.Connection, r: _Run) -> None:
        """Double the run's stride and delete its rows off the new stride (the first kept)."""
        r.stride *= 2
        db.execute("DELETE FROM samples WHERE run_id = ? AND step > 1 AND step % ? != 0", (r.id, r.stride))
        r.samples = db.execute("SELECT COUNT(*) FROM samples WHERE run_id = ?", (r.id,)).fetchone()[0]

    def _alert(self, db: sqlite3.Connection, t: Transition) -> None:
        r = self._run(db, t.job, t.run, t.time)
        db.execute("INSERT INTO alerts (run_id, alertname, severity, state_from, state_to, step, time, value, "
                   f"threshold, summary, causes, checks, ranks, groups) VALUES ({', '.join('?' * 14)})",
                   (r.id, *transition_row(t)))
        if t.alertname == "TrainingCrashed" and t.state_to == "firing":
            db.execute("UPDATE runs SET state = 'crashed' WHERE id = ?", (r.id,))

    def _start(self, db: sqlite3.Connection, job: str, run: str, command: str, tags: dict[str, str],
               t: float) -> None:
        r = self._run(db, job, run, t)
        db.execute("UPDATE runs SET command = ?, started = MIN(COALESCE(started, ?), ?) WHERE id = ?",
                   (command[:1000], t, t, r.id))
        if tags:
            db.execute("UPDATE runs SET tags = COALESCE(tags, ?) WHERE id = ?", (json.dumps(tags_of(tags)), r.id))

    def _end(self, db: sqlite3.Connection, job: str, run: str, status: int, t: float) -> None:
        r = self._run(db, job, run, t)
        db.execute("UPDATE runs SET exit_status = ?, ended = ?, state = ? WHERE id = ?",
                   (status, t, "finished" if status == 0 else "crashed", r.id))
