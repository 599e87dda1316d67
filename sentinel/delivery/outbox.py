"""The durable outbox: one SQLite file (WAL) that holds every notification from before it
is sent until it is delivered, given up, or pruned.

Each row is one message for one target (a route's URL, or Alertmanager), with an
idempotency key (unique: the same transition for the same target is stored once, and a
resend after a crash between "sent" and "marked sent" carries the same key). Rows are
*claimed* by a process before sending (its host and pid), so several engines sharing the
default file never send a row twice; a claim by a process that no longer exists is void.

A file that cannot be opened or written (a full or read-only disk) degrades to an
in-memory database: delivery goes on, ``degraded`` counts the switch, a line is logged.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentinel.files import private_sqlite

log = logging.getLogger("sentinel")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    route TEXT NOT NULL,
    target TEXT NOT NULL,
    payload TEXT NOT NULL,
    created REAL NOT NULL,
    due REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'pending',
    owner TEXT,
    done REAL
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (state, target, due);
"""


def default_path() -> Path:
    """``$XDG_STATE_HOME/sentinel/outbox.sqlite``, else ``~/.local/state/sentinel/outbox.sqlite``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "sentinel" / "outbox.sqlite"


@dataclass
class Row:
    id: int
    key: str
    route: str
    target: str
    payload: dict[str, Any]
    created: float
    attempts: int


def _alive(owner: str, host: str) -> bool:
    h, _, pid = owner.rpartition(":")
    if h != host or not pid.isdigit():
        return True  # another host's claim: respect it (its lease is the row's due time)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class Outbox:
    """The outbox table. Thread-safe (one connection under a lock).

    Args:
        path: the SQLite file; None or ``":memory:"`` for an in-memory outbox.
        max_rows: rows kept at most (delivered ones are pruned first).
        keep_seconds: delivered rows are kept this long.
    """

    def __init__(self, path: str | Path | None, max_rows: int = 10_000, keep_seconds: float = 86_400.0) -> None:
        self.max_rows, self.keep_seconds = max_rows, keep_seconds
        self.degraded = 0
        self.path = str(path) if path else ":memory:"
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._host = socket.gethostname()
        self._lock = threading.Lock()
        self._mine: dict[str, None] = {}  # keys this process stored, the newest max_rows (for left())
        self._db = self._open(self.path)

    @property
    def durable(self) -> bool:
        return self.path != ":memory:"

    def _open(self, path: str) -> sqlite3.Connection:
        if path != ":memory:":
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                private_sqlite(path)  # before SQLite makes its -wal and -shm files, which take its mode
                db = sqlite3.connect(path, timeout=5.0, check_same_thread=False, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives a process crash
                db.executescript(_SCHEMA)
                return db
            except (OSError, sqlite3.Error) as exc:
                self._degrade(exc)
        db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        db.executescript(_SCHEMA)
        return db

    def _degrade(self, exc: BaseException) -> None:
        self.degraded += 1
        log.warning("sentinel outbox: cannot use the outbox file (%s: %s); delivering from memory, "
                    "undelivered notifications will not survive a restart", type(exc).__name__,
                    getattr(exc, "strerror", None) or exc)
        self.path = ":memory:"

    def _write(self, sql: str, args: tuple[Any, ...] | list[tuple[Any, ...]], many: bool = False) -> int:
        """Run a write; on a disk error switch to memory and retry there once."""
        with self._lock:
            for _ in range(2):
                try:
                    cur = (self._db.executemany(sql, args) if many  # type: ignore[arg-type]
                           else self._db.execute(sql, args))
                    return cur.rowcount
                except sqlite3.IntegrityError:
                    return 0
                except sqlite3.Error as exc:
                    if not self.durable:
                        raise
                    self._degrade(exc)
                    self._db = self._open(":memory:")
            return 0

    def put(self, key: str, route: str, target: str, payload: dict[str, Any], now: float) -> bool:
        """Store one message (committed before this returns). False if the key was stored already."""
        n = self._write("INSERT INTO outbox (key, route, target, payload, created, due) VALUES (?,?,?,?,?,?)",
                        (key, route, target, json.dumps(payload), now, now))
        if n > 0:
            self._mine[key] = None
            if len(self._mine) > self.max_rows:
                del self._mine[next(iter(self._mine))]
        return n > 0

    def left(self) -> int:
        """Rows this process stored that are still pending: what its stop leaves for the next
        process with this file (other processes' rows in a shared file are theirs)."""
        keys = list(self._mine)
        n = 0
        with self._lock:
            for i in range(0, len(keys), 500):
                chunk = keys[i:i + 500]
                n += int(self._db.execute(
                    f"SELECT COUNT(*) FROM outbox WHERE state='pending' AND key IN ({','.join('?' * len(chunk))})",
                    chunk).fetchone()[0])
        return n

    def claim(self, targets: Collection[str], now: float, limit: int = 32, lease: float = 60.0) -> list[Row]:
        """Take up to ``limit`` due rows of these targets for sending, oldest first."""
        if not targets:
            return []
        marks = ",".join("?" * len(targets))
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                rows = self._db.execute(
                    f"SELECT id, key, route, target, payload, created, attempts, owner, due FROM outbox "
                    f"WHERE state='pending' AND target IN ({marks}) AND (due <= ? OR owner IS NOT NULL) "
                    f"ORDER BY id LIMIT ?", (*targets, now, limit * 4)).fetchall()
                out = []
                for rid, key, route, target, payload, created, attempts, owner, due in rows:
                    if owner is not None and due > now and (owner == self.owner or _alive(owner, self._host)):
                        continue  # in flight here or in another live process, within its lease
                    out.append(Row(rid, key, route, target, json.loads(payload), created, attempts))
                    if len(out) >= limit:
                        break
                self._db.executemany("UPDATE outbox SET owner=?, due=? WHERE id=?",
                                     [(self.owner, now + lease, r.id) for r in out])
                self._db.execute("COMMIT")
                return out
            except sqlite3.Error as exc:
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                if self.durable:
                    self._degrade(exc)
                    self._db = self._open(":memory:")
                return []

    def delivered(self, row_id: int, now: float) -> None:
        self._write("UPDATE outbox SET state='sent', done=?, owner=NULL, attempts=attempts+1 WHERE id=?",
                    (now, row_id))

    def retry(self, row_id: int, due: float) -> None:
        """A failed attempt: count it, try again at ``due``."""
        self._write("UPDATE outbox SET due=?, owner=NULL, attempts=attempts+1 WHERE id=?", (due, row_id))

    def defer(self, row_id: int, due: float) -> None:
        """Not attempted (the route's rate limit): try at ``due``."""
        self._write("UPDATE outbox SET due=?, owner=NULL WHERE id=?", (due, row_id))

    def release(self, row_ids: Collection[int]) -> None:
        """Give back claimed rows unsent (at shutdown)."""
        self._write("UPDATE outbox SET owner=NULL WHERE id=?", [(i,) for i in row_ids], many=True)

    def expire(self, targets: Collection[str], older_than: float, now: float) -> list[Row]:
        """Give up pending rows created before ``older_than``; returns them."""
        if not targets:
            return []
        marks = ",".join("?" * len(targets))
        with self._lock:
            rows = self._db.execute(
                f"SELECT id, key, route, target, payload, created, attempts FROM outbox WHERE state='pending' "
                f"AND target IN ({marks}) AND created < ? AND owner IS NULL", (*targets, older_than)).fetchall()
        out = [Row(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6]) for r in rows]
        self._write("UPDATE outbox SET state='expired', done=? WHERE id=?", [(now, r.id) for r in out], many=True)
        return out

    def prune(self, now: float) -> int:
        """Delete delivered rows past ``keep_seconds``, and the oldest beyond ``max_rows``."""
        n = self._write("DELETE FROM outbox WHERE state!='pending' AND done < ?", (now - self.keep_seconds,))
        with self._lock:
            total = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]
        if total > self.max_rows:
            excess = total - self.max_rows
            n += self._write("DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY state='pending', id "
                             "LIMIT ?)", (excess,))
        return n

    def depth(self, targets: Collection[str], now: float) -> tuple[int, float]:
        """Pending rows of these targets, and the age of the oldest (0 when none)."""
        if not targets:
            return 0, 0.0
        marks = ",".join("?" * len(targets))
        with self._lock:
            n, oldest = self._db.execute(
                f"SELECT COUNT(*), MIN(created) FROM outbox WHERE state='pending' AND target IN ({marks})",
                tuple(targets)).fetchone()
        return int(n), (max(0.0, now - oldest) if oldest is not None else 0.0)

    def unsent(self, targets: Collection[str], until: float) -> int:
        """Rows of these targets never attempted and due by ``until``, or in flight here
        (what a clean stop waits for; failed rows wait for the next start)."""
        if not targets:
            return 0
        marks = ",".join("?" * len(targets))
        with self._lock:
            return int(self._db.execute(
                f"SELECT COUNT(*) FROM outbox WHERE state='pending' AND target IN ({marks}) "
                f"AND ((attempts = 0 AND due <= ?) OR owner = ?)", (*targets, until, self.owner)).fetchone()[0])

    def rows(self) -> list[tuple[str, str, str, int]]:
        """``(key, route, state, attempts)`` of every row, oldest first (for tests and the CLI)."""
        with self._lock:
            return list(self._db.execute("SELECT key, route, state, attempts FROM outbox ORDER BY id"))

    def close(self) -> None:
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error:
                pass

