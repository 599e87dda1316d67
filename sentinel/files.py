"""Files of the daemon's that only their user may read: the SQLite history and outbox."""

from __future__ import annotations

import os
from pathlib import Path

SIDECARS = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside a database: they hold its recent pages."""


def private_sqlite(path: str | os.PathLike[str]) -> None:
    """Create ``path`` if it is missing, and make it and its SQLite sidecars mode 0600,
    before SQLite opens it: SQLite gives the ``-wal`` and ``-shm`` files it creates the
    database file's permission bits, so a file chmodded only after opening leaves them as
    the umask made them (0644: readable by every user of the machine).

    Raises:
        OSError: the file cannot be created or its mode changed (not this user's).
    """
    p = Path(path)
    os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o600))
    for name in (p, *(p.with_name(p.name + s) for s in SIDECARS)):
        if name.exists():
            os.chmod(name, 0o600)
