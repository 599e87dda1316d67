"""When the history writer tries a batch again: a locked file is waited out, any other
failure is final.

Another process holding the file's write lock (a ``sqlite3`` shell in ``BEGIN EXCLUSIVE``,
a backup, a second engine) is ``SQLITE_BUSY``/``SQLITE_LOCKED``: the writer keeps its batch
and tries again after a delay that doubles from :data:`FIRST_DELAY` to :data:`MAX_DELAY`
(on top of SQLite's own busy wait, ``connect(timeout=...)``), for at most ``give_up``
seconds of failures in a row. A corrupt, full or unreadable file is not retried.
"""

from __future__ import annotations

import sqlite3

FIRST_DELAY = 0.05
"""Seconds before the first retry."""
MAX_DELAY = 2.0
"""The delay between retries stops doubling here."""

_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (primary result codes)


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` means another connection holds a lock (worth retrying)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _BUSY_CODES
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


class Backoff:
    """The retry schedule of one run of failures.

    Args:
        give_up: seconds of failures in a row after which :meth:`failed` says stop.
    """

    def __init__(self, give_up: float) -> None:
        self.give_up = give_up
        self.since: float | None = None
        """When the current run of failures began (None: the last attempt succeeded)."""
        self.delay = FIRST_DELAY
        self.next_at = 0.0
        """The monotonic time of the next attempt."""

    def failed(self, now: float) -> bool:
        """Record a failed attempt at ``now``. Returns False when it is time to give up."""
        if self.since is None:
            self.since, self.delay = now, FIRST_DELAY
        if now - self.since >= self.give_up:
            return False
        self.next_at = now + self.delay
        self.delay = min(2 * self.delay, MAX_DELAY)
        return True

    def succeeded(self, now: float) -> float | None:
        """Record a success at ``now``; returns how long the failures lasted (None: there were none)."""
        since, self.since, self.next_at = self.since, None, 0.0
        return None if since is None else now - since

    def wait(self, now: float) -> float:
        """Seconds until the next attempt (0: now)."""
        return max(0.0, self.next_at - now) if self.since is not None else 0.0
