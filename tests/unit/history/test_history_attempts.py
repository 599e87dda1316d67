"""A run name used again is a new run: a new row of ``runs`` (``attempt`` 2, 3, …), its own
steps, aggregates and series; ``RUN`` names the latest, ``RUN@N`` and ``#ID`` an older one."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from sentinel.history import db as hdb
from sentinel.history.attempts import RunRow, starts_new
from sentinel.history.query import find_run, list_runs, series
from sentinel.history.recorder import Recorder


def row(**kw: Any) -> RunRow:
    return RunRow(**{"id": 1, "attempt": 1, "stride": 1, "samples": 0, "records": 0, "best": None, **kw})


@pytest.mark.parametrize(("r", "kind", "rank", "step", "new"), [
    (row(ranks={0}, last={0: 5}), "step", 0, 6, False),  # going on
    (row(ranks={0}, last={0: 5}), "log", 0, 5, False),
    (row(ranks={0}, last={0: 5}), "step", 0, 1, True),  # started over (killed, then run again)
    (row(ranks={0, 1}, last={0: 1}), "step", 1, 1, False),  # rank 1's first step
    (row(ranks={0}, byes={0}, state="finished"), "step", 0, 1, True),
    (row(ranks={0}, byes={0}, state="finished"), "log", 0, 0, True),  # a log before the first step
    (row(ranks={0}, byes={0}, state="finished"), "bye", 0, 3, False),  # a goodbye never opens a run
    (row(ranks={0}, exit_status=0, state="finished"), "step", 0, 9, True),  # sentinel run's command ended
    (row(ranks={0, 1}, byes={1}, state="crashed", last={0: 4}), "step", 0, 5, False),  # rank 1 crashed, 0 goes on
    (row(ranks={0, 1}, byes={1}, state="crashed"), "step", 1, 1, True),  # the crashed rank again
    (row(ranks={0}, last={0: 5}, state="crashed"), "step", 0, 6, False),  # TrainingCrashed, still reporting
    # rank 1's first frame after rank 0's goodbye, in a run of 2: the same run
    (row(ranks={0}, byes={0}, state="finished", world=2), "step", 1, 1, False),
    (row(ranks={0}, byes={0}, state="finished", world=2), "log", 1, 0, False),
    (row(ranks={0}, byes={0}, state="finished", world=2), "step", (1, "0"), 1, False),  # a stream of rank 1
    (row(ranks={0}, byes={0}, state="finished", world=2), "step", 0, 1, True),  # rank 0 again: a new run
    (row(ranks={0}, byes={0}, state="finished", world=2), "step", 2, 1, True),  # not one of the 2 ranks
    (row(ranks={0}, byes={0}, state="finished"), "step", 1, 1, True),  # no world said: a new run
    (row(ranks={0}, byes={0}, state="finished", world=2, exit_status=0), "step", 1, 1, True),  # command ended
    # Hogwild: worker 1's first frame after worker 0 (a process of its own) said goodbye
    (row(ranks={0}, streams={(0, "0")}, byes={(0, "0")}, state="finished", world=1), "step", (0, "1"), 1, False),
    (row(ranks={0}, streams={(0, "0")}, byes={(0, "0")}, state="finished", world=1), "step", (0, "0"), 1, True),
    (row(ranks={0}, streams={(0, "0")}, byes={(0, "0")}, state="finished", exit_status=0), "step", (0, "1"), 1,
     True),  # the command ended
])
def test_which_frames_start_a_new_run(r: RunRow, kind: str, rank: int | tuple[int, str], step: int,
                                      new: bool) -> None:
    assert starts_new(r, kind, rank, step) is new


def frame(kind: str, step: int, rank: int = 0, world: int = 1, run: str = "r", **extra: Any) -> dict[str, Any]:
    f: dict[str, Any] = {"kind": kind, "job": "j", "run": run, "rank": rank, "world": world, "step": step,
                         "t": time.time()}
    if kind == "step":
        f |= {"groups": ["a"], "grad_sumsq": [float(step)], "scalars": {"loss": 100.0 / step}}
    return f | extra


def steps(first: int, last: int, **kw: Any) -> list[tuple[str, Any]]:
    return [("frame", frame("step", s, **kw)) for s in range(first, last + 1)]


BYE = ("frame", frame("bye", 0))
S = [("start", ("j", "r", "python train.py"))]  # sentinel run starts its command
END = [("end", ("j", "r", 0))]  # and records its exit status

SCENARIOS: dict[str, tuple[list[tuple[str, Any]], list[tuple[int, str]]]] = {
    # name: (items, [(steps, state) per attempt])
    "run again after it finished": (steps(1, 3) + [BYE] + steps(1, 2), [(3, "finished"), (2, "running")]),
    # the row before can get no frame again: it ends at its last one (a crash the engine
    # found is recorded as one: "crashed", below)
    "killed without a goodbye, run again": (steps(1, 3) + steps(1, 2), [(3, "finished"), (2, "running")]),
    "the next fold of a k-fold loop (a new model, step 1)": (
        steps(1, 3) + steps(1, 3) + steps(1, 2), [(3, "finished"), (3, "finished"), (2, "running")]),
    # DDP: rank 1's last step of the ended fold reaches the writer after rank 0 began again
    "the next fold of a DDP k-fold loop, its ranks' frames interleaved": (
        steps(1, 3, world=2) + steps(1, 2, rank=1, world=2) + steps(1, 1, world=2) + steps(3, 3, rank=1, world=2)
        + steps(1, 2, rank=1, world=2) + steps(2, 2, world=2), [(3, "finished"), (2, "running")]),
    "resumed while running (later steps)": (steps(1, 3) + steps(4, 5), [(5, "running")]),
    "one rank crashed, the other goes on": (
        steps(1, 1) + steps(1, 1, rank=1, world=2) + [("frame", frame("bye", 1, rank=1, exc="RuntimeError"))]
        + steps(2, 3), [(3, "crashed")]),
    "rank 1 starts after rank 0 said goodbye": (
        steps(1, 2, world=2) + [("frame", frame("bye", 0, world=2))] + steps(1, 2, rank=1, world=2)
        + [("frame", frame("bye", 0, rank=1, world=2))], [(2, "finished")]),
    "a Hogwild worker starts after the other said goodbye": (
        steps(1, 2, opt="0") + [("frame", frame("bye", 2, opt="0"))] + steps(1, 2, opt="1")
        + [("frame", frame("bye", 2, opt="1"))], [(2, "finished")]),
    "sentinel run twice": (S + steps(1, 2) + [BYE] + END + S + steps(1, 4), [(2, "finished"), (4, "running")]),
    "a command ended with no frame, then the name again": (S + END + S + steps(1, 1), [(0, "finished"),
                                                                                       (1, "running")]),
}


def record(path: Path, items: list[tuple[str, Any]]) -> Recorder:
    rec = Recorder(path, flush_seconds=0.05)
    for kind, item in items:
        if kind == "frame":
            assert rec.offer_frame(item)
        elif kind == "start":
            rec.run_started(*item)
        else:
            rec.run_ended(*item)
    assert rec.flush(30)
    rec.close()
    assert rec.degraded == 0
    return rec


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_reused_run_name_gets_a_row_per_run(tmp_path: Path, name: str) -> None:
    items, expected = SCENARIOS[name]
    path = tmp_path / "h.sqlite"
    record(path, items)
    db = hdb.connect(path, readonly=True)
    got = db.execute("SELECT attempt, steps, state FROM runs WHERE run = 'r' ORDER BY attempt").fetchall()
    assert got == [(i + 1, n, state) for i, (n, state) in enumerate(expected)]
    ends = db.execute("SELECT state, ended, last_seen FROM runs WHERE run = 'r'").fetchall()
    assert all(ended is not None for state, ended, _ in ends if state != "running"), ends
    for attempt, (n, _) in enumerate(expected, 1):
        info = find_run(db, f"r@{attempt}")
        assert info is not None and info.attempt == attempt
        assert series(db, info).steps == list(range(1, n + 1))  # its own steps only, never the other run's
        assert info.final_loss == (pytest.approx(100.0 / n) if n else None)
    latest = find_run(db, "r")
    assert latest is not None and latest.attempt == len(expected)


@pytest.mark.parametrize(("byes", "status"), [
    # attached `sentinel run` (batch script, sidecar, systemd): each task's non-zero exit in a bye
    ([(1, {"status": 3}), (0, {"status": 1})], 3),
    ([(0, {"status": 137}), (1, {"status": 3})], 137),
    ([(1, {})], 1),  # an uncaught exception's goodbye says no status: 1, as Python exits
])
def test_a_crashed_runs_exit_status_is_its_ranks_highest(tmp_path: Path, byes: list[tuple[int, dict[str, Any]]],
                                                         status: int) -> None:
    path = tmp_path / "h.sqlite"
    items = steps(1, 2, world=2) + steps(1, 2, rank=1, world=2)
    record(path, items + [("frame", frame("bye", 2, rank=rank, world=2, exc="python (pid 7)", **extra))
                          for rank, extra in byes])
    run = find_run(hdb.connect(path, readonly=True), "r")
    assert run is not None and (run.state, run.exit_status, run.ranks) == ("crashed", status, 2)


@pytest.mark.parametrize(("bye", "state"), [
    ({"thread": "trainer"}, "crashed"),
    # the command's own status is the word on a process's exception (a launcher restarted it)
    ({}, "finished"),
])
def test_a_training_thread_that_failed_is_a_crash_whatever_the_process_exits_with(
        tmp_path: Path, bye: dict[str, Any], state: str) -> None:
    """A web UI's training thread failed; the process went on and `sentinel run` recorded its
    exit status 0: the run crashed, and its exit status is the process's."""
    path = tmp_path / "h.sqlite"
    record(path, S + steps(1, 3) + [("frame", frame("bye", 3, exc="RuntimeError at app.py:9", **bye))] + END)
    run = find_run(hdb.connect(path, readonly=True), "r")
    assert run is not None and (run.state, run.exit_status, run.steps) == (state, 0, 3)


def test_a_crash_status_survives_a_writer_restart_between_two_goodbyes(tmp_path: Path) -> None:
    """The daemon restarted between two ranks' crash goodbyes: the second writer reads the run
    from the file, and the lower status it is told later does not overwrite the higher one."""
    path = tmp_path / "h.sqlite"
    record(path, steps(1, 2, world=2) + steps(1, 2, rank=1, world=2)
           + [("frame", frame("bye", 2, rank=1, world=2, exc="python (pid 7)", status=137))])
    record(path, [("frame", frame("bye", 2, rank=0, world=2, exc="python (pid 6)", status=1))])
    run = find_run(hdb.connect(path, readonly=True), "r")
    assert run is not None and (run.state, run.exit_status, run.attempts) == ("crashed", 137, 1)


def test_a_new_engine_on_the_same_file_starts_a_new_row_after_a_finished_run(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    record(path, steps(1, 3) + [BYE])
    record(path, steps(1, 2))  # a second process: its recorder reads the file, not its memory
    db = hdb.connect(path, readonly=True)
    runs = list_runs(db)
    assert [(r.label, r.steps, r.attempts) for r in runs] == [("r@2", 2, 2), ("r@1", 3, 2)]
    first = find_run(db, f"#{runs[1].id}")
    assert first is not None and first.attempt == 1 and first.steps == 3
    assert find_run(db, "j/r@1") == first and find_run(db, "r@3") is None


def test_a_v2_file_is_migrated_to_one_row_per_attempt_keeping_its_runs(tmp_path: Path) -> None:
    """A file written by the previous sentinel (schema 2, one row per name): opened, migrated
    in place (ids, series and alerts kept), and a name used again there gets attempt 2."""
    path = tmp_path / "h.sqlite"
    old = sqlite3.connect(path, isolation_level=None)
    hdb.migrate(old, target=2)
    old.execute("INSERT INTO runs (id, job, run, started, steps, final_loss, state, env) "
                "VALUES (7, 'j', 'r', ?, 3, 0.5, 'finished', '{}')", (time.time() - 60,))
    old.executemany("INSERT INTO samples (run_id, step, loss) VALUES (7, ?, ?)", [(s, 1.0 / s) for s in (1, 2, 3)])
    old.execute("INSERT INTO alerts (run_id, alertname, severity, state_to) VALUES (7, 'X', 'warning', 'firing')")
    with pytest.raises(sqlite3.IntegrityError):  # the old schema: one row per (job, run)
        old.execute("INSERT INTO runs (job, run) VALUES ('j', 'r')")
    old.close()
    ro = hdb.connect(path, readonly=True)  # the CLI opens it: migrated first, then read
    assert hdb.version_of(ro) == hdb.SCHEMA_VERSION == 5
    info = find_run(ro, "r")
    assert info is not None and (info.id, info.attempt, info.steps, info.final_loss) == (7, 1, 3, 0.5)
    assert series(ro, info).steps == [1, 2, 3] and info.alerts == {"warning": 1}
    ro.close()
    record(path, steps(1, 2))
    ro = hdb.connect(path, readonly=True)
    assert [(r.id == 7, r.attempt, r.steps) for r in list_runs(ro)] == [(False, 2, 2), (True, 1, 3)]
    old_run = find_run(ro, "r@1")
    assert old_run is not None and series(ro, old_run).steps == [1, 2, 3]


def test_a_ranks_frames_written_after_another_writer_ended_the_run_are_that_run(tmp_path: Path) -> None:
    """Each rank's own engine under a plain torchrun writes the one file: rank 1's writer ended
    the row before rank 0's writer made its first commit, and rank 0's steps, sent while the
    run went on, opened a second row (the file keeps how many ranks a row had, not which, so
    rank 0 read as a rank that had said goodbye). Frames sent before the row's end are its own."""
    path = tmp_path / "h.sqlite"
    rank0 = steps(1, 3, rank=0, world=2)  # sent first...
    rank1 = steps(1, 3, rank=1, world=2) + [("frame", frame("bye", 3, rank=1, world=2))]
    bye0 = [("frame", frame("bye", 3, rank=0, world=2))]
    record(path, rank1)  # ... written after rank 1's writer finished the row
    record(path, rank0 + bye0)
    db = hdb.connect(path, readonly=True)
    assert [(r.steps, r.state, r.attempts) for r in list_runs(db)] == [(3, "finished", 1)]
    assert db.execute("SELECT ranks FROM runs").fetchall() == [(2,)]
    record(path, steps(1, 2, rank=0, world=2))  # a new training under the name, sent after the end
    assert [(r.label, r.steps) for r in list_runs(hdb.connect(path, readonly=True))] == [("r@2", 2), ("r@1", 3)]
