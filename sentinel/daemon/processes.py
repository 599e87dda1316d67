"""What the daemon side knows of processes and sockets that the engine (the pure pipeline)
must not touch: whether a reporting process still exists, and the reply sockets a shared
daemon answers the ranks on."""

from __future__ import annotations

import os
from typing import Any


def alive(pid: int) -> bool:
    """Whether a process exists (a zombie counts: its parent will report its status)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: exists, another user's
        return True
    return True


def running(pid: int) -> bool:
    """Whether a process exists and has not exited: :func:`alive`, a zombie excepted (read
    from ``/proc`` where there is one)."""
    if not alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # it exited since, or there is no /proc (macOS): alive is all there is
        return not os.path.isdir("/proc")
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


class Replies:
    """A shared daemon's way back to the ranks: the reply socket each rank's frames name
    (``reply``), taken only when it lies in the daemon's own private ``folder`` and is
    named ``reply-*``. Fed as an engine frame listener; a run's entries go when the engine
    drops the run, and the sockets crashed ranks left behind are removed then.

    Args:
        folder: the daemon's socket folder.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.paths: dict[tuple[str, str, int], str] = {}

    def note(self, frame: dict[str, Any]) -> None:
        """An engine frame listener: remember a step or log frame's reply socket."""
        reply = frame.get("reply")
        if frame.get("kind") not in ("step", "log") or not isinstance(reply, str):
            return
        rk = (frame["job"], frame["run"], frame["rank"])
        if reply != self.paths.get(rk) and len(reply) < 200 and os.path.dirname(reply) == self.folder \
                and os.path.basename(reply).startswith("reply-"):
            self.paths[rk] = reply

    def dropped(self, job: str, run: str, exited: set[tuple[str, str, int]]) -> None:
        """An engine drop listener: forget the run's sockets, removing those of ranks that
        exited without a goodbye (a clean rank removes its own)."""
        for rk in [rk for rk in self.paths if rk[:2] == (job, run)]:
            path = self.paths.pop(rk)
            if rk in exited:
                _unlink(path)

    def close(self) -> None:
        """The daemon stops: the sockets of ranks that crashed were never removed."""
        for path in self.paths.values():
            _unlink(path)
        self.paths.clear()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
