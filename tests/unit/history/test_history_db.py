"""The history file: migrated not recreated, bounded, and a bad file is "no history", never a crash."""

from __future__ import annotations

import math
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from sentinel import wire
from sentinel.history import db as hdb
from sentinel.history.query import find_run, series, steps_to_target
from sentinel.history.recorder import Recorder
from sentinel.instrument.options import check_tags, from_kwargs
from tests.helpers import wait_for

GROUPS = [f"layers.{i}" for i in range(64)]


def step_frame(step: int, loss: float | None = None, run: str = "r", full: bool = True) -> dict[str, Any]:
    f: dict[str, Any] = {"kind": "step", "job": "j", "run": run, "rank": 0, "world": 1, "step": step,
                         "t": 1000.0 + step, "groups": GROUPS, "grad_sumsq": [1.0] * 64, "lr": [0.1]}
    if full and step % 10 == 0:
        f["param_sumsq"] = [4.0] * 64
        f["delta_sumsq"] = [0.01] * 64
        f["mem"] = {"host_rss": 1000.0 + step}
    if loss is not None:
        f["scalars"] = {"loss": loss}
    return f


def wired(frame: dict[str, Any]) -> dict[str, Any]:
    """``frame`` as the engine hands it to the history: encoded, decoded and held to its type."""
    return wire.as_map(wire.decode_strict(wire.encode(frame)))


def record(path: Path, frames: list[dict[str, Any]], **kw: Any) -> Recorder:
    rec = Recorder(path, **kw)
    for f in frames:
        assert rec.offer_frame(f)
    assert rec.flush(60)
    rec.close()
    return rec


def test_a_v1_file_is_migrated_in_place_and_keeps_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    old = sqlite3.connect(path, isolation_level=None)
    hdb.migrate(old, target=1)
    old.execute("INSERT INTO runs (job, run, started, steps, final_loss) VALUES ('j', 'old', ?, 7, 0.5)",
                (time.time(),))
    old.close()
    db = hdb.connect(path)
    assert hdb.version_of(db) == hdb.SCHEMA_VERSION == 5
    assert db.execute("SELECT run, steps, final_loss, env FROM runs").fetchall() == [("old", 7, 0.5, None)]
    db.close()
    record(path, [step_frame(1, 2.0, run="new") | {"env": {"torch": "2.13.0"}}])
    ro = hdb.connect(path, readonly=True)
    assert {r[0] for r in ro.execute("SELECT run FROM runs")} == {"old", "new"}
    info = find_run(ro, "new")
    assert info is not None and info.env == {"torch": "2.13.0"}


_OPEN_ON_GO = """
import sys
from sentinel.history import db
print("ready", flush=True)
sys.stdin.read(1)  # the go: every process is ready, past its imports
db.connect(sys.argv[1]).close()
"""


def test_engines_that_open_a_new_file_at_once_all_record(tmp_path: Path) -> None:
    """Two scripts started together, or two engines of one script's trials in threads, open
    the default history file at the same moment: every step of the schema ran in both, and
    the second failed on ``table runs already exists`` and recorded no history for its run.
    Eight real processes, each past its imports, are told to open each of three new files
    at once."""
    import subprocess
    import sys

    for k in range(3):
        path = tmp_path / f"h{k}.sqlite"
        procs = [subprocess.Popen([sys.executable, "-c", _OPEN_ON_GO, str(path)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
        for p in procs:  # each waits for the go with its imports done
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("g")
            p.stdin.flush()
        errors = [p.communicate(timeout=60)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * 8, "\n".join(e for e in errors if e)
        with hdb.connect(path, readonly=True) as db:
            assert hdb.version_of(db) == hdb.SCHEMA_VERSION


@pytest.mark.parametrize("damage", ["garbage", "newer", "locked"])  # locked: past retry_seconds
def test_a_bad_file_is_no_history_with_a_counter_not_a_crash(tmp_path: Path, damage: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "h.sqlite"
    holder = None
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 200)
    elif damage == "newer":
        db = hdb.connect(path)
        db.execute("UPDATE schema_version SET version = 99")
        db.close()
    else:  # another process holds the write lock for the whole run
        hdb.connect(path).close()
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
    rec = Recorder(path, flush_seconds=0.05, retry_seconds=0.2)
    for s in range(1, 50):
        rec.offer_frame(step_frame(s, 1.0))
    rec.flush(20)
    rec.close()
    assert rec.degraded == 1 and not rec.up
    assert (rec.retries >= 1) is (damage == "locked")  # only a lock is worth waiting for
    assert rec.dropped + rec._lost >= 1  # nothing written, all of it counted
    assert sum("no run history is recorded" in r.getMessage() for r in caplog.records) == 1
    rows = dict((name, v) for name, _, _, v in rec.rows())
    assert rows["sentinel_history_up"] == 0.0 and rows["sentinel_history_degraded_total"] == 1.0
    if holder is not None:
        holder.execute("ROLLBACK")


def test_a_locked_file_is_retried_keeping_the_batch_and_the_newest_frames(tmp_path: Path) -> None:
    """Another connection holds the write lock for a while: the writer keeps the batch it
    took and retries; the queue keeps its newest 64 items (the oldest dropped, counted);
    when the lock goes, all of that is written and history goes on."""
    path = tmp_path / "h.sqlite"
    rec = Recorder(path, flush_seconds=0.05, queue_size=64)
    for s in range(1, 11):
        rec.offer_frame(step_frame(s, 1.0))
    assert rec.flush(10)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        rec.offer_frame(step_frame(11, 1.0))
        wait_for(lambda: rec.retries >= 1, what="the writer to find the file locked")  # it holds step 11
        for s in range(12, 212):  # 200 more while locked: the queue keeps the newest 64
            assert rec.offer_frame(step_frame(s, 1.0))
        assert rec.up and rec.degraded == 0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert rec.flush(30)
    rows = {name: v for name, _, _, v in rec.rows()}
    rec.close()
    ro = hdb.connect(path, readonly=True)
    kept = [r[0] for r in ro.execute("SELECT step FROM samples ORDER BY step")]
    assert kept == list(range(1, 12)) + list(range(148, 212))
    assert rec.dropped == 136 and rec.degraded == 0
    assert rows["sentinel_history_retries_total"] >= 1 and rows["sentinel_history_dropped_total"] == 136
    assert rows["sentinel_history_up"] == 1.0 and rows["sentinel_history_queue_depth"] == 0
    run = find_run(ro, "r")
    assert run is not None and run.steps == 211 and run.mean_grad_norm == pytest.approx(math.sqrt(64))


def test_history_retry_seconds_and_queue_size_come_from_the_config(tmp_path: Path) -> None:
    from sentinel.config import load_config
    from sentinel.daemon.service import make_history
    from sentinel.rules.config import ConfigError

    cfg, _ = load_config({"history": {"path": str(tmp_path / "h.sqlite"), "retry_seconds": 7, "queue_size": 64}})
    rec = make_history(cfg)
    assert rec is not None and (rec.retry_seconds, rec.queue_size) == (7, 64)
    rec.close()
    with pytest.raises(ConfigError, match="history.retry_seconds"):
        load_config({"history": {"retry_seconds": -1}})


def test_a_million_steps_at_64_groups_stay_under_the_bound(tmp_path: Path) -> None:
    """1M steps through the recorder, at every step for the first 32,768 (where the stride
    is below 16) and every 16th step after (the steps the stride keeps from there on, and
    enough for the aggregates); the file must stay under max_points rows and its size bound."""
    path = tmp_path / "h.sqlite"
    rec = Recorder(path, max_points=4096, queue_size=200_000, flush_seconds=0.05)
    n = 0
    for s in list(range(1, 32_769)) + list(range(32_784, 1_000_001, 16)):
        rec.offer_frame(step_frame(s, 10.0 / math.sqrt(s), full=s % 160 == 0 or s < 32_769))
        n += 1
        if n % 20_000 == 0:
            assert rec.flush(120)
    assert rec.flush(120)
    rec.close()
    db = hdb.connect(path, readonly=True)
    run = find_run(db, "r")
    assert run is not None and run.steps == 1_000_000
    rows = db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    assert 2048 <= rows <= 4097
    assert run.stride in (256, 512)
    assert os.path.getsize(path) < 6 * 2**20  # docs/history.md: under 6 MiB a run at 64 groups
    assert run.final_loss == pytest.approx(0.01)  # exact whatever was thinned
    # 10/sqrt(s) <= 0.1 first at s = 10,000; past 4,096 new minima, records are 0.1% apart in loss
    assert steps_to_target(db, run, 0.1) in range(10_000, 10_025)
    assert steps_to_target(db, run, 1.0) == 100  # among the first 4,096 minima: exact
    kept = series(db, run)
    assert kept.steps[0] == 1 and len(kept.group_grad) == rows and len(kept.group_grad[0]) == 64


@pytest.mark.parametrize(("tags", "ok"), [
    ({"optimizer": "lion", "lr": "3e-4", "seed": 1}, True),
    ({f"k{i}": "v" for i in range(17)}, False),
    ({"run": "x"}, False),
    ({"bad-key": "x"}, False),
    ({"k": "v" * 65}, False),
    ({"k" * 33: "v"}, False),
])
def test_tags_are_bounded(tags: dict[str, Any], ok: bool) -> None:
    if ok:
        assert check_tags(tags) == {k: str(v) for k, v in tags.items()}
    else:
        with pytest.raises(ValueError, match="tags"):
            check_tags(tags)


def test_launcher_tags_merge_under_the_scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENTINEL_TAGS", '{"seed": "3", "lr": "1e-3"}')
    assert from_kwargs({"tags": {"lr": "3e-4"}}).tags == {"seed": "3", "lr": "3e-4"}


def test_the_optimizer_comes_from_a_frames_field_else_from_the_tags(tmp_path: Path) -> None:
    import torch

    from sentinel.instrument import optinfo

    path = tmp_path / "h.sqlite"
    opt = torch.optim.AdamW(torch.nn.Linear(2, 1).parameters(), lr=1e-3)
    record(path, [step_frame(1, 1.0, run="tagged") | {"tags": {"optimizer": "lion"}},
                  wired(step_frame(1, 1.0, run="field") | {"tags": {"optimizer": "lion"},  # what the instrument sends
                                                            "optim": optinfo.describe([opt])})])
    db = hdb.connect(path, readonly=True)
    tagged, field = find_run(db, "tagged"), find_run(db, "field")
    assert tagged is not None and tagged.optimizer_name == "lion" and tagged.optimizer is None
    assert field is not None and field.optimizer_name == "AdamW"
    assert field.optimizer == [{"class": "AdamW", "dtype": "float32", "lr": 1e-3, "eps": 1e-8, "weight_decay": 0.01,
                                "beta1": 0.9, "beta2": 0.999, "decoupled": 1.0}]


def test_retention_deletes_runs_by_age_then_the_oldest_by_size(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    frames = [step_frame(s, 1.0, run=name) | {"t": t0 + s} for name, t0 in (("old", 1e9), ("mid", 2e9), ("new", 3e9))
              for s in range(1, 1500)]
    record(path, frames, keep_seconds=1e12, max_bytes=2**40)
    db = hdb.connect(path)
    assert hdb.used_bytes(db) > 3 * 2**20
    assert hdb.enforce_retention(db, now=3e9, keep_seconds=1.5e9, max_bytes=2**40) == 1  # "old": by age
    assert hdb.enforce_retention(db, now=3e9, keep_seconds=1e12, max_bytes=2**20) == 1  # "mid": by size
    assert [r[0] for r in db.execute("SELECT run FROM runs")] == ["new"]  # the newest stays, whatever its size
    assert db.execute("SELECT COUNT(DISTINCT run_id) FROM samples").fetchone()[0] == 1


def test_a_stream_that_changes_optimizer_class_names_both_in_order(tmp_path: Path) -> None:
    """A PINN trains by Adam, then LBFGS, one run of steps going on: the run names both
    ("Adam+LBFGS"; it named LBFGS alone), and a record of a class seen before replaces its
    entry (the hyperparameters follow the schedule)."""
    import torch

    from sentinel.instrument import optinfo

    params = list(torch.nn.Linear(2, 1).parameters())
    adam, lbfgs = torch.optim.Adam(params, lr=1e-3), torch.optim.LBFGS(params, lr=1.0)
    path = tmp_path / "h.sqlite"
    frames = [wired(step_frame(s, 1.0, run="pinn") | {"optim": optinfo.describe([adam])}) for s in (1, 2)]
    adam.param_groups[0]["lr"] = 5e-4  # a scheduler's step
    frames.append(wired(step_frame(3, 1.0, run="pinn") | {"optim": optinfo.describe([adam])}))
    frames += [wired(step_frame(s, 1.0, run="pinn") | {"optim": optinfo.describe([lbfgs])}) for s in (4, 5)]
    record(path, frames)
    run = find_run(hdb.connect(path, readonly=True), "pinn")
    assert run is not None and run.optimizer_name == "Adam+LBFGS"
    assert [(o["class"], o["lr"]) for o in run.optimizer or []] == [("Adam", 5e-4), ("LBFGS", 1.0)]
