"""The SQLite outbox on a real file: idempotent keys, claims, retries, expiry, pruning."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from sentinel.delivery.outbox import Outbox


def test_a_key_is_stored_once_and_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite"
    box = Outbox(path)
    assert box.put("k1", "0", "t", {"title": "a"}, 10.0)
    assert not box.put("k1", "0", "t", {"title": "again"}, 11.0)  # a resubmission is recognised
    box.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    again = Outbox(path)
    [row] = again.claim(["t"], 12.0)
    assert row.key == "k1" and row.payload == {"title": "a"}
    assert again.claim(["t"], 12.0) == []  # claimed: not handed out twice
    again.retry(row.id, 20.0)
    assert again.claim(["t"], 15.0) == [] and again.depth(["t"], 15.0) == (1, 5.0)
    [row] = again.claim(["t"], 20.0)
    again.delivered(row.id, 21.0)
    assert again.depth(["t"], 22.0) == (0, 0.0) and again.rows() == [("k1", "0", "sent", 2)]


def test_a_claim_by_a_dead_process_is_void(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite"
    Outbox(path).put("k1", "0", "t", {}, 10.0)
    code = (f"from sentinel.delivery.outbox import Outbox; b = Outbox({str(path)!r}); "
            "assert len(b.claim(['t'], 11.0, lease=3600)) == 1")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)  # claims it, then exits
    [row] = Outbox(path).claim(["t"], 12.0)  # long before its lease ends
    assert row.key == "k1"


def test_old_rows_expire_and_the_table_is_bounded(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite", max_rows=100, keep_seconds=60.0)
    for i in range(150):
        box.put(f"k{i}", "0", "t", {}, float(i))
    for row in box.claim(["t"], 1000.0, limit=120):
        box.delivered(row.id, 1000.0)
    assert [r.key for r in box.expire(["t"], older_than=140.0, now=1000.0)] == [f"k{i}" for i in range(120, 140)]
    box.prune(1030.0)
    rows = box.rows()
    assert len(rows) == 100 and [k for k, _, s, _ in rows if s == "pending"] == [f"k{i}" for i in range(140, 150)]
    box.prune(2000.0)  # delivered and expired rows past keep_seconds go
    assert [s for _, _, s, _ in box.rows()] == ["pending"] * 10


def test_left_counts_the_pending_rows_this_process_stored_not_its_neighbours(tmp_path: Path) -> None:
    """Two runs on a node share the default file: what a stop reports as left undelivered is
    its own, whatever the other run left."""
    path = tmp_path / "o.sqlite"
    mine, theirs = Outbox(path), Outbox(path)
    for k in ("a", "b", "c"):
        mine.put(k, "0", "t", {}, 10.0)
    theirs.put("x", "0", "t", {}, 10.0)
    assert not mine.put("x", "0", "t", {}, 10.0)  # stored by the other: still not mine
    [first, *_] = mine.claim(["t"], 11.0, limit=1)
    mine.delivered(first.id, 12.0)
    assert mine.left() == 2 and theirs.left() == 1
    small = Outbox(tmp_path / "small.sqlite", max_rows=2)
    for k in ("a", "b", "c"):
        small.put(k, "0", "t", {}, 10.0)
    assert small.left() == 2  # it remembers its newest max_rows keys, no more
