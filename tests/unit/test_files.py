"""The history and the outbox are their user's alone: the SQLite file and the ``-wal`` and
``-shm`` files beside it (they hold its recent pages: commands, tags, alert text) are mode
0600 under the usual umask of 022, also when an older version left them readable."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sentinel.delivery.outbox import Outbox
from sentinel.files import private_sqlite
from sentinel.history import db as hdb


def _history(path: Path) -> Callable[[], None]:
    return hdb.connect(path).close


def _outbox(path: Path) -> Callable[[], None]:
    return Outbox(str(path)).close


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("open_store", [_history, _outbox], ids=["history", "outbox"])
@pytest.mark.parametrize("stale", [False, True], ids=["new", "left-readable"])
def test_the_file_and_its_wal_are_private(tmp_path: Path, umask_022: None, open_store: Callable[[Path], Callable[[], None]],
                                          stale: bool) -> None:
    path = tmp_path / "store.sqlite"
    if stale:  # as an older version left them: the file chmodded, its sidecars as the umask made them
        old = sqlite3.connect(path, isolation_level=None)
        old.execute("PRAGMA journal_mode=WAL")
        old.execute("CREATE TABLE x (y)")
        os.chmod(path, 0o600)
        for name in tmp_path.iterdir():
            if name != path:
                assert name.stat().st_mode & 0o777 == 0o644
    close = open_store(path)
    try:
        modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    finally:
        close()
        if stale:
            old.close()
    assert modes == {"store.sqlite": 0o600, "store.sqlite-wal": 0o600, "store.sqlite-shm": 0o600}


def _journal_churn(journal: str, stop: Any) -> None:
    """Another connection's transactions: its ``-journal`` made and removed, again and again."""
    while not stop.is_set():
        with open(journal, "wb"):
            pass
        os.unlink(journal)


def test_a_sidecar_another_process_removes_meanwhile_is_no_error(tmp_path: Path) -> None:
    """A ``-journal`` lives only as long as its transaction: another process's may end between
    a look and the chmod. That was an error (CI: one of eight engines opening a new history at
    once lost its history on ``FileNotFoundError``). Here a real process makes and removes
    the journal while this one makes the file private, 2,000 times."""
    path = tmp_path / "h.sqlite"
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    churn = ctx.Process(target=_journal_churn, args=(str(path) + "-journal", stop))
    churn.start()
    try:
        for _ in range(2000):
            private_sqlite(path)
    finally:
        stop.set()
        churn.join(10)
    assert churn.exitcode == 0
    assert path.stat().st_mode & 0o777 == 0o600
