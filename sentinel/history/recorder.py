"""The history recorder: the engine hands it frames and transitions (a bounded queue, no
I/O), a writer thread writes them to the history file in batches.

Bound: each run keeps at most ``max_points`` rows in ``samples`` (rank 0's). A run starts
with every step; each time it would pass ``max_points`` the stride doubles and the rows off
the new stride are deleted, so a run of any length holds between ``max_points / 2`` and
``max_points`` rows (plus its first step). ``loss_records`` holds every new loss minimum for the first ``max_points``, then
those at least 0.1% below the last (4 × ``max_points`` rows at most); the run's aggregates (final loss, means, peak memory)
are exact whatever was thinned.

A run name used again is a new run, a new row (:mod:`sentinel.history.attempts`). For a
sharded run the norms come from the engine's assembly of every rank's sums
(:meth:`Recorder.offer_assembled`), not from rank 0's frame, which covers its shards only.

Never a crash: a file locked by another process is waited out, the batch kept and tried
again with a growing delay (:mod:`sentinel.history.retry`; ``retries`` counts the
attempts), while the queue stays bounded by dropping its oldest items. A file that cannot
be opened, is corrupt or full, or stays locked for ``retry_seconds``, switches the
recorder off ("no history"): ``degraded`` counts it, one line is logged, and frames are
then only counted as dropped. Training never waits for it.
"""

from __future__ import annotations

import logging
import socket
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sentinel.history import db as hdb
from sentinel.history.batch import BatchWriter, queued
from sentinel.history.retry import Backoff, is_locked
from sentinel.rules.alert import Transition
from sentinel.store import Row

log = logging.getLogger("sentinel")


class Recorder:
    """Records runs, their thinned series and their alerts in the history file.

    Args:
        path: the SQLite file.
        max_points: sample rows kept per run at most (see the module's docstring).
        keep_seconds: runs last seen longer ago than this are deleted.
        max_bytes: past this many bytes in use, the oldest runs are deleted.
        queue_size: items (frames, transitions) waiting for the writer at most; past it the
            oldest waiting item is dropped and counted.
        flush_seconds: the writer commits a batch at least this often.
        retry_seconds: a file locked by another process for this long in a row is given
            up ("no history"); until then the writer keeps its batch and retries.
        clock: wall clock.
    """

    def __init__(self, path: str | Path, max_points: int = 4096, keep_seconds: float = 90 * 86_400.0,
                 max_bytes: int = 2**30, queue_size: int = 65_536, flush_seconds: float = 0.5,
                 retry_seconds: float = 300.0, clock: Callable[[], float] = time.time) -> None:
        self.path = str(path)
        self.max_points, self.keep_seconds, self.max_bytes = max_points, keep_seconds, max_bytes
        self.queue_size, self.flush_seconds, self.clock = queue_size, flush_seconds, clock
        self.retry_seconds = retry_seconds
        self.host = socket.gethostname()
        self.degraded = 0
        self.dropped = 0  # refused or pushed out of the queue (the engine's thread only)
        self.written = 0  # items written (committed)
        self.batches = 0
        self.retries = 0  # attempts at a batch that found the file locked
        self._offered = 0
        self._lost = 0  # taken but not written (an error degraded the file mid-batch)
        self._evicted = 0  # pushed out of a full queue (the engine's thread only)
        self._queue: deque[tuple[str, Any]] = deque()
        self._held = 0  # items of the batch the writer holds (kept across retries)
        self._wake = threading.Event()
        self._stop = False
        self._off = False  # no history: degraded for good
        self._backoff = Backoff(retry_seconds)
        self._writer = BatchWriter(max_points, self.host)
        self._db: sqlite3.Connection | None = None  # None while not open (off, or locked at start)
        try:
            self._open()
        except Exception as exc:
            if is_locked(exc):  # the writer opens it with its first batch (and retries)
                self.retries += 1
                log.warning("sentinel history: %s is locked by another process; opening it later "
                            "(sentinel_history_retries_total)", self.path)
            else:
                self._degrade(exc)
        self._thread = threading.Thread(target=self._loop, name="sentinel-history", daemon=True)
        self._thread.start()

    @property
    def up(self) -> bool:
        """Whether history is being written (or waited for: the file is locked)."""
        return not self._off

    # -- the engine's side: no I/O, never blocks ----------------------------------------------

    def _offer(self, item: tuple[str, Any]) -> bool:
        if self._off:
            self.dropped += 1
            return False
        if len(self._queue) >= self.queue_size:  # full (the file is locked, or slow): the oldest go
            try:
                self._queue.popleft()
                self._evicted += 1
                self.dropped += 1
            except IndexError:  # the writer took them meanwhile
                pass
        self._offered += 1
        self._queue.append(item)
        return True

    def offer_frame(self, frame: dict[str, Any]) -> bool:
        """Queue a decoded, admitted frame (an engine frame listener), or of a rank other than 0
        only what the writer reads of it (:func:`sentinel.history.batch.queued`). False if dropped."""
        return self._offer(("frame", queued(frame)))

    def offer_assembled(self, values: dict[str, Any]) -> bool:
        """Queue the whole model's sums of one step of a sharded run, as the engine assembled
        them from every rank's frame (shaped as a step frame of rank 0: ``job``, ``run``,
        ``step``, ``t``, ``groups``, ``grad_sumsq``, ``param_sumsq``?, ``delta_sumsq``?)."""
        return self._offer(("assembled", values))

    def offer_transition(self, t: Transition) -> bool:
        """Queue an alert transition (an engine listener)."""
        return self._offer(("alert", t))

    def run_started(self, job: str, run: str, command: str = "", tags: dict[str, str] | None = None) -> None:
        """What ``sentinel run`` knows before any frame: the command and its ``--tag``s."""
        self._offer(("start", (job, run, command, tags or {}, self.clock())))

    def run_moved(self, job: str, run: str, to: list[str]) -> None:
        """``sentinel run``'s command reported under the runs ``to`` only, not under ``run``
        (its script names its own: ``watch(run=...)``): they take ``run``'s command and tags,
        and ``run``'s empty row goes."""
        self._offer(("moved", (job, run, list(to), self.clock())))

    def run_ended(self, job: str, run: str, status: int) -> None:
        """The command's exit status (``sentinel run``): 0 finished, else crashed."""
        self._offer(("end", (job, run, status, self.clock())))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is committed; False on timeout or no history."""
        target = self._offered
        deadline = time.monotonic() + timeout
        self._wake.set()
        while self.written + self._lost + self._evicted < target:
            if self._off or time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.005)
        return True

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
        yield ("sentinel_history_retries_total", "counter", (), float(self.retries))
        yield ("sentinel_history_queue_depth", "gauge", (), float(len(self._queue) + self._held))

    # -- the writer thread -----------------------------------------------------------------------

    def _open(self) -> None:
        db = hdb.connect(self.path)
        try:
            hdb.enforce_retention(db, self.clock(), self.keep_seconds, self.max_bytes)
        except BaseException:
            db.close()
            raise
        self._db = db

    def _degrade(self, exc: BaseException) -> None:
        self.degraded += 1
        self._off = True
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

    def _take(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        pop = self._queue.popleft
        try:
            for _ in range(min(4096, len(self._queue))):
                out.append(pop())
        except IndexError:  # the engine's thread pushed the oldest out meanwhile
            pass
        return out

    def _loop(self) -> None:
        batch: list[tuple[str, Any]] = []  # taken, not yet committed: kept while the file is locked
        while True:
            self._wake.wait(self._backoff.wait(time.monotonic()) or self.flush_seconds)
            self._wake.clear()
            while not self._off and self._backoff.wait(time.monotonic()) == 0:
                if not batch:
                    batch = self._take()
                    self._held = len(batch)
                    if not batch:
                        break
                if not self._attempt(batch):
                    break
                batch = []
                self._held = 0
            if self._off:  # no history: what is held and queued is lost
                batch += self._take()
                while batch:
                    self._lost += len(batch)
                    batch = self._take()
                self._held = 0
            if self._stop:
                self._lost += len(batch)
                self._held = 0
                if self._db is not None:
                    self._db.close()
                    self._db = None
                return

    def _attempt(self, batch: list[tuple[str, Any]]) -> bool:
        """Write one batch; True if committed. A locked file keeps the batch for a retry."""
        try:
            if self._db is None:
                self._open()
            self._write(batch)
        except Exception as exc:
            now = time.monotonic()
            if is_locked(exc) and self._backoff.failed(now):
                self.retries += 1
                if self._backoff.since == now:
                    log.warning("sentinel history: %s is locked by another process; keeping %d item(s) and "
                                "retrying (sentinel_history_retries_total)", self.path, len(batch))
                return False
            self._lost += len(batch)
            self._degrade(exc)  # corrupt, full, or locked too long: no history, never a crash
            return False
        self.written += len(batch)
        self.batches += 1
        waited = self._backoff.succeeded(time.monotonic())
        if waited is not None:
            log.warning("sentinel history: %s writable again after %.1f s; history goes on", self.path, waited)
        return True

    def _write(self, batch: list[tuple[str, Any]]) -> None:
        db = self._db
        assert db is not None
        db.execute("BEGIN IMMEDIATE")  # locked: raises here, before anything moved
        try:
            self._writer.write(db, batch)
            if self.batches % 1000 == 999:
                hdb.enforce_retention(db, self.clock(), self.keep_seconds, self.max_bytes)
            db.execute("COMMIT")
        except BaseException:
            self._writer.forget()  # its view of the runs may be ahead of the file: reload it
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
