"""Files of the daemon's that only their user may read (the SQLite history and outbox), and
file names made from what a run is called."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

SIDECARS = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside a database: they hold its recent pages."""


def private_sqlite(path: str | os.PathLike[str]) -> None:
    """Create ``path`` if it is missing, and make it and its SQLite sidecars mode 0600,
    before SQLite opens it: SQLite gives the ``-wal`` and ``-shm`` files it creates the
    database file's permission bits, so a file chmodded only after opening leaves them as
    the umask made them (0644: readable by every user of the machine).

    Raises:
        OSError: the file cannot be created or its mode changed (not this user's). A
            sidecar that is not there (or that another process's transaction removed between
            a look and the change: a ``-journal`` lives only as long as its transaction) is
            no error.
    """
    p = Path(path)
    os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(p, 0o600)
    for name in (p.with_name(p.name + s) for s in SIDECARS):
        try:
            os.chmod(name, 0o600)
        except FileNotFoundError:  # none, or gone: another connection's transaction ended meanwhile
            pass


def safe_name(s: str, limit: int = 64, keep: str = "") -> str:
    """``s`` as one harmless path component: ``[A-Za-z0-9_.-]`` and the characters of
    ``keep``, no leading dot, at most ``limit`` characters; a changed name gets a hash of
    the original, so two runs whose names differ only in odd characters keep separate
    files (a run named ``exp/lr-3e-4``, or ``../x``, stays one file of the folder)."""
    out = re.sub(rf"[^A-Za-z0-9_.{re.escape(keep)}-]", "_", s)[:limit]
    if out.startswith("."):
        out = "_" + out[1:]
    if out != s or not out:
        out = f"{out}-{hashlib.sha256(s.encode()).hexdigest()[:8]}"
    return out
