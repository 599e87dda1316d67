"""Two processes that report one stream at once (a sweep's trials side by side, two scripts
given one run name): the later one's frames go to a run of its own (``Engine._split``).

Real engine, real frames (wire-encoded), real processes for the pids and their liveness."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from sentinel import wire
from sentinel.daemon import processes
from sentinel.engine.engine import Engine
from sentinel.engine.validate import Limits
from sentinel.store import labels_of


def _step(step: int, loss: float, run: str = "sweep") -> bytes:
    return wire.encode({"kind": "step", "job": "train", "run": run, "rank": 0, "world": 1, "step": step,
                        "t": 1000.0 + step, "groups": ["a"], "grad_sumsq": [1.0], "step_seconds": 0.1,
                        "scalars": {"loss": loss}})


def _bye(step: int, run: str = "sweep") -> bytes:
    return wire.encode({"kind": "bye", "job": "train", "run": run, "rank": 0, "step": step, "t": 1000.0 + step})


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Three live processes whose pids the frames carry (the trials)."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(3)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _losses(engine: Engine, run: str) -> list[tuple[int, float]]:
    window = engine.store.window("sentinel_loss", labels_of(job="train", run=run, rank=0))
    assert window is not None, run
    return [(int(s), float(v)) for s, v in zip(window.steps, window.values)]


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _engine() -> Engine:
    return Engine(alive=processes.alive, running=processes.running)


def test_three_trials_side_by_side_are_three_runs_each_whole(sleepers: list[subprocess.Popen[bytes]],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    engine = _engine()
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        for step in range(1, 31):  # interleaved, as their datagrams arrive
            for k, p in enumerate(sleepers):
                assert engine.feed(_step(step, 1.0 + k + step / 100), pid=p.pid)
    assert [_losses(engine, run)[-1] for run in ("sweep", "sweep-2", "sweep-3")] == [
        (30, 1.3), (30, 2.3), (30, 3.3)]
    assert all([s for s, _ in _losses(engine, run)] == list(range(1, 31)) for run in ("sweep", "sweep-2", "sweep-3"))
    assert engine.restarts == 0 and engine.runs_split == 2
    lines = [r.getMessage() for r in caplog.records if "go to run" in r.getMessage()]
    assert lines == [
        f"sentinel engine: pid {sleepers[1].pid} reports rank 0 of run 'sweep', which pid {sleepers[0].pid} reports "
        "too and is still running (two trainings given one run name: a sweep's trials side by side?); "
        f"pid {sleepers[1].pid}'s frames go to run 'sweep-2'",
        f"sentinel engine: pid {sleepers[2].pid} reports rank 0 of run 'sweep', which pid {sleepers[0].pid} reports "
        "too and is still running (two trainings given one run name: a sweep's trials side by side?); "
        f"pid {sleepers[2].pid}'s frames go to run 'sweep-3'"]


def test_a_goodbye_ends_the_run_its_process_was_given(sleepers: list[subprocess.Popen[bytes]]) -> None:
    engine = _engine()
    a, b = sleepers[0].pid, sleepers[1].pid
    for step in range(1, 6):
        engine.feed(_step(step, 1.0), pid=a)
        engine.feed(_step(step, 2.0), pid=b)
    assert engine.feed(_bye(5), pid=b)
    assert engine.rules.ranks("train", "sweep-2") == set()  # its run ended
    assert engine.rules.ranks("train", "sweep") == {0}  # the first trial's goes on
    engine.feed(_step(6, 1.0), pid=a)
    assert _losses(engine, "sweep")[-1] == (6, 1.0)


@pytest.mark.parametrize("before", ["said goodbye", "exited", "is a zombie"])
def test_a_process_after_the_streams_last_one_ended_takes_the_name_over(before: str) -> None:
    """Sequential trials (each waits for the last), a restart after a crash: the run's next
    attempt, not a run of its own. A zombie (exited, its parent not waited yet) has ended."""
    engine = _engine()
    first = subprocess.Popen([sys.executable, "-c", "pass"] if before != "said goodbye"
                             else [sys.executable, "-c", "import time; time.sleep(120)"])
    second = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        for step in range(1, 6):
            engine.feed(_step(step, 1.0), pid=first.pid)
        if before == "said goodbye":
            engine.feed(_bye(5), pid=first.pid)
        elif before == "exited":
            first.wait()  # reaped: the pid is gone
        else:
            deadline = time.monotonic() + 30
            while _state(first.pid) != "Z" and time.monotonic() < deadline:  # exited, not reaped
                time.sleep(0.01)
            assert not processes.running(first.pid)
            assert processes.alive(first.pid)  # a crash check still waits for its status
        for step in range(1, 4):
            engine.feed(_step(step, 2.0), pid=second.pid)
        assert engine.runs_split == 0 and engine.aliases == {}
        assert _losses(engine, "sweep") == [(1, 2.0), (2, 2.0), (3, 2.0)]  # started over: a new attempt
    finally:
        for p in (first, second):
            p.kill()
            p.wait()


def test_the_name_given_fits_the_label_cap_and_skips_one_in_use(sleepers: list[subprocess.Popen[bytes]]) -> None:
    engine = Engine(alive=processes.alive, running=processes.running, limits=Limits(max_label_length=8))
    run = "abcdefgh"
    engine.feed(_step(1, 1.0, run="abcdef-2"), pid=sleepers[2].pid)  # a run of that name already reports
    engine.feed(_step(1, 1.0, run=run), pid=sleepers[0].pid)
    engine.feed(_step(1, 2.0, run=run), pid=sleepers[1].pid)
    assert engine.aliases == {("train", run, sleepers[1].pid): "abcdef-3"}
    assert _losses(engine, "abcdef-3") == [(1, 2.0)]


def test_without_the_senders_pid_nothing_is_split() -> None:
    """The process engine and the thread engine serve one process: no pid, no split."""
    engine = _engine()
    for step in range(1, 4):
        engine.feed(_step(step, 1.0))
    assert engine.feed(_step(1, 2.0)) and engine.runs_split == 0
