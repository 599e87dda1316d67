"""TrainingCrashed: a rank's process ends without finishing, and the engine says how.

Real engine, real frames (wire-encoded), real processes for the liveness check.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from sentinel import wire
from sentinel.daemon import processes
from sentinel.engine.engine import Engine


def _frame(rank: int, step: int, t: float, loss: float = 0.5) -> bytes:
    return wire.encode({"kind": "step", "job": "train", "run": "r1", "rank": rank, "world": 2, "step": step,
                        "t": t, "groups": ["a", "b"], "grad_sumsq": [0.25, 1.0], "step_seconds": 0.1,
                        "scalars": {"loss": loss}})


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _engine(steps: int = 20) -> tuple[Engine, Clock]:
    clock = Clock()
    engine = Engine(clock=clock, alive=processes.alive)
    for step in range(steps):
        clock.t += 0.1
        for rank in (0, 1):
            assert engine.feed(_frame(rank, step, clock.t, loss=2.0 - step / 100))
    return engine, clock


def test_sigkill_fires_training_crashed_with_the_status_and_the_last_values() -> None:
    engine, clock = _engine()
    clock.t += 1
    out = engine.exited("train", "r1", 128 + signal.SIGKILL, rank=1, who="rank 1 (pid 4242)")
    fired = [t for t in out if t.state_to == "firing"]
    assert [t.alertname for t in fired] == ["TrainingCrashed"]
    alert = engine.api_alerts()["data"]["alerts"][0]
    assert alert["alertname"] == "TrainingCrashed" and alert["state"] == "firing"
    assert alert["severity"] == "critical" and alert["ranks"] == [1] and alert["step"] == 19
    s = alert["summary"]
    assert "SIGKILL (signal 9)" in s and "OOM killer" in s and "rank 1 (pid 4242)" in s, s
    assert "last values (step 19, 1 s before): loss 1.81, grad norm 1.12" in s, s
    assert alert["value"] == 137.0


def test_a_crashed_rank_does_not_also_stall_and_a_restart_resolves_it() -> None:
    engine, clock = _engine()
    engine.exited("train", "r1", 1, rank=1)
    for _ in range(30):  # rank 0 goes on; rank 1 is silent for far longer than the stall limit
        clock.t += 100
        engine.feed(_frame(0, 20, clock.t))
        engine.tick()
    names = {a["alertname"]: a for a in engine.alerts_json()}
    assert "TrainingStalled" not in names
    assert names["TrainingCrashed"]["state"] == "firing" and "exited with status 1" in names["TrainingCrashed"]["summary"]
    engine.feed(_frame(1, 0, clock.t))  # the rank is back (a restart)
    firing = [a["alertname"] for a in engine.alerts_json() if a["state"] == "firing"]
    assert "TrainingCrashed" not in firing
    assert any(a["alertname"] == "TrainingCrashed" and a["state"] == "resolved" for a in engine.alerts_json())


def test_the_whole_command_failing_marks_every_rank_of_the_run() -> None:
    engine, clock = _engine()
    engine.feed(wire.encode({"kind": "bye", "job": "train", "run": "r1", "rank": 0, "step": 20, "t": clock.t}))
    engine.exited("train", "r1", 1, who="torchrun (pid 7)")
    alert = next(a for a in engine.alerts_json() if a["alertname"] == "TrainingCrashed")
    assert alert["ranks"] == [0, 1]  # the job failed: rank 0 said goodbye, yet its command exited 1


@pytest.mark.parametrize("goodbye", [True, False])
def test_a_command_failing_after_its_ranks_goodbye_says_it_failed_at_exit(goodbye: bool) -> None:
    """torch's gloo backend can abort a rank as its Python exits, after the script ended and
    Sentinel's goodbye went out: the job still failed (torchrun exits 1), and the page says
    the training had ended and the failure came at exit, where to look first."""
    engine, clock = _engine()
    if goodbye:
        for rank in (0, 1):
            engine.feed(wire.encode({"kind": "bye", "job": "train", "run": "r1", "rank": rank, "step": 19,
                                     "t": clock.t}))
    clock.t += 1
    engine.exited("train", "r1", 1, who="torchrun (pid 7)")
    alert = next(a for a in engine.alerts_json() if a["alertname"] == "TrainingCrashed")
    assert alert["state"] == "firing" and alert["ranks"] == [0, 1]
    s = alert["summary"]
    said = ("torchrun (pid 7), after the script had ended without an error (its goodbye came first): it failed "
            "as it exited (a raise SystemExit(N)")
    assert (said in s) is goodbye and "exited with status 1" in s and "last values (step 19" in s, s
    assert s.count("exited with status 1") == 1, s  # the ranks' words are the same: said once


def test_a_command_that_dies_before_its_first_step_still_alerts() -> None:
    engine = Engine(alive=processes.alive)
    out = engine.exited("train", "never-stepped", 2, who="python train.py")
    assert [t.alertname for t in out if t.state_to == "firing"] == ["TrainingCrashed"]
    assert "no step reported" in out[0].summary and "exited with status 2" in out[0].summary


def test_exit_status_zero_is_not_a_crash() -> None:
    engine, _ = _engine()
    assert engine.exited("train", "r1", 0) == []
    assert not engine.alerts_json()


def test_a_vanished_process_is_found_on_tick() -> None:
    engine, clock = _engine()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid no longer exists
    try:
        clock.t += 0.1
        engine.feed(_frame(0, 20, clock.t), pid=alive.pid)
        engine.feed(_frame(1, 20, clock.t), pid=dead.pid)
        engine.tick()
        alert = next(a for a in engine.alerts_json() if a["alertname"] == "TrainingCrashed")
        assert alert["ranks"] == [1] and alert["value"] == -1.0
        assert f"pid {dead.pid}" in alert["summary"] and "exit status unknown" in alert["summary"]
    finally:
        alive.kill()
        alive.wait()


def test_a_goodbye_on_an_uncaught_exception_is_a_crash_a_plain_one_is_not() -> None:
    engine, clock = _engine()
    engine.feed(wire.encode({"kind": "bye", "job": "train", "run": "r1", "rank": 0, "step": 20, "t": clock.t}))
    engine.feed(wire.encode({"kind": "bye", "job": "train", "run": "r1", "rank": 1, "step": 20, "t": clock.t,
                             "exc": "RuntimeError"}))
    alert = next(a for a in engine.alerts_json() if a["alertname"] == "TrainingCrashed")
    assert alert["ranks"] == [1] and "rank 1 raised RuntimeError" in alert["summary"]
    assert "exited with status 1" in alert["summary"]


def test_a_training_thread_that_failed_is_a_crash_of_a_process_that_goes_on() -> None:
    """A goodbye naming the thread the exception ended: the crash says the process went on
    (not that it exited with status 1), and the process's clean exit later does not end
    the crash."""
    engine, clock = _engine()
    engine.feed(wire.encode({"kind": "bye", "job": "train", "run": "r1", "rank": 1, "step": 20, "t": clock.t,
                             "exc": "RuntimeError at app.py:12", "thread": "Thread-1 (train)"}))
    alert = next(a for a in engine.alerts_json() if a["alertname"] == "TrainingCrashed")
    s = alert["summary"]
    assert alert["ranks"] == [1] and alert["state"] == "firing", alert
    assert "its training thread ended on an uncaught exception, the process going on" in s, s
    assert "thread 'Thread-1 (train)' of rank 1 raised RuntimeError at app.py:12" in s, s
    assert "exited with status" not in s, s
    assert engine.store.last("sentinel_exit_status", (("job", "train"), ("rank", "1"), ("run", "r1")))[2] == -2.0
    clock.t += 5
    engine.exited("train", "r1", 0, who="python app.py")  # `sentinel run`: the command exits 0
    engine.tick()
    assert [a["state"] for a in engine.alerts_json() if a["alertname"] == "TrainingCrashed"] == ["firing"]


def _runs_in_store(engine: Engine) -> set[str]:
    return {dict(labels).get("run", "") for _, _, labels, _ in engine.store.snapshot()}


def test_a_daemon_forgets_runs_that_ended_and_runs_gone_silent() -> None:
    """A node daemon outlives its jobs: the series of a finished run go after ended_ttl
    (time for a last scrape), those of a run silent for idle_ttl after that long."""
    clock = Clock()
    engine = Engine(clock=clock, ended_ttl=60, idle_ttl=3600, alive=processes.alive)
    for run in ("done", "crashed", "going", "silent"):
        for step in range(5):
            clock.t += 0.1
            engine.feed(wire.encode({"kind": "step", "job": "train", "run": run, "rank": 0, "world": 1, "step": step,
                                     "t": clock.t, "groups": ["a"], "grad_sumsq": [1.0], "scalars": {"loss": 1.0}}))
    engine.feed(wire.encode({"kind": "bye", "job": "train", "run": "done", "rank": 0, "step": 5, "t": clock.t}))
    engine.exited("train", "crashed", 137, rank=0)
    assert _runs_in_store(engine) == {"done", "crashed", "going", "silent"}
    clock.t += 30
    engine.tick()
    assert _runs_in_store(engine) == {"done", "crashed", "going", "silent"}  # not yet scraped for the last time
    for _ in range(40):  # "going" keeps reporting
        clock.t += 1
        engine.feed(wire.encode({"kind": "step", "job": "train", "run": "going", "rank": 0, "world": 1, "step": 9,
                                 "t": clock.t, "scalars": {"loss": 1.0}}))
        engine.tick()
    assert _runs_in_store(engine) == {"going", "silent"}
    crash = next(a for a in engine.alerts_json() if a["alertname"] == "TrainingCrashed")
    assert crash["state"] == "resolved"  # the run is gone with its series
    clock.t += 3600
    engine.feed(wire.encode({"kind": "step", "job": "train", "run": "going", "rank": 0, "world": 1, "step": 10,
                             "t": clock.t, "scalars": {"loss": 1.0}}))
    engine.tick()
    assert _runs_in_store(engine) == {"going"} and engine.runs_dropped == 3


def test_many_processes_vanishing_at_once_are_recorded_a_slice_at_a_time(monkeypatch: object) -> None:
    """The crash check's work per call is bounded (engine.CRASHES_PER_CALL), so a mass exit
    is recorded over several calls while the frames of the living keep being ingested."""
    import sentinel.engine.engine as engine_module

    monkeypatch.setattr(engine_module, "CRASHES_PER_CALL", 8)  # type: ignore[attr-defined]
    clock = Clock()
    engine = Engine(clock=clock, alive=processes.alive)
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(30)]
    try:
        for i, p in enumerate(procs):
            data = wire.encode({"kind": "step", "job": "sweep", "run": f"r{i}", "rank": 0, "world": 1, "step": 1,
                                "t": clock.t, "groups": ["a"], "grad_sumsq": [1.0]})
            assert engine.feed(data, pid=p.pid)
        for p in procs:
            p.kill()
            p.wait()
        clock.t += 1
        engine.tick()
        assert len(engine.exited_ranks) == 8 and engine.crash_backlog == 22
        assert engine.feed(_frame(0, 1, clock.t))  # an unrelated rank is ingested in between
        calls = 0
        while engine.crash_backlog:
            engine.reap()
            calls += 1
        assert calls == 3 and len(engine.exited_ranks) == 30
        clock.t += 1
        engine.tick()  # the group wait is over: one crash alert per run, firing
        firing = {a["run"] for a in engine.alerts_json()
                  if a["alertname"] == "TrainingCrashed" and a["state"] == "firing"}
        assert firing == {f"r{i}" for i in range(30)}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _stream_frame(opt: str, step: int, t: float, kind: str = "step") -> bytes:
    f = {"kind": kind, "job": "train", "run": "hog", "rank": 0, "world": 1, "step": step, "t": t, "opt": opt}
    if kind == "step":
        f.update(groups=["a"], grad_sumsq=[1.0], step_seconds=0.1, scalars={"loss": 0.5})
    return wire.encode(f)


@pytest.mark.parametrize(("frames", "crashed"), [
    # worker 0 finished and exited; worker 1 (alive) goes on: no crash (its pid was the rank's last)
    ([("1", "alive", "step"), ("0", "dead", "step"), ("0", "dead", "bye")], False),
    # worker 0 vanished without a goodbye while worker 1 reported after it: a crash
    ([("0", "dead", "step"), ("1", "alive", "step")], True),
])
def test_a_ranks_streams_in_processes_of_their_own_are_watched_each(frames: list[tuple[str, str, str]],
                                                                    crashed: bool) -> None:
    """Hogwild: a rank's streams are worker processes of their own; each one's process is
    checked, and one that said goodbye is not taken for a crash when it exits."""
    clock = Clock()
    engine = Engine(clock=clock, alive=processes.alive)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid no longer exists
    pids = {"alive": alive.pid, "dead": dead.pid}
    try:
        for step in range(1, 4):
            for opt in ("0", "1"):
                clock.t += 0.1
                assert engine.feed(_stream_frame(opt, step, clock.t), pid=alive.pid)
        for opt, who, kind in frames:
            clock.t += 0.1
            assert engine.feed(_stream_frame(opt, 4, clock.t, kind), pid=pids[who])
        engine.tick()
        fired = [a for a in engine.alerts_json() if a["alertname"] == "TrainingCrashed"]
        assert bool(fired) == crashed, fired
        if crashed:
            assert f"pid {dead.pid}" in fired[0]["summary"]
    finally:
        alive.kill()
        alive.wait()


def test_a_rank_with_two_optimizers_that_raises_is_reported_with_its_last_values() -> None:
    """A GAN (two optimizers, two streams of a rank) whose script raises after training: the
    crash names the step and the last values of the rank's first stream, not "no step"."""
    clock = Clock()
    engine = Engine(clock=clock, alive=processes.alive)
    for step in range(1, 6):
        for opt in ("0", "1"):
            clock.t += 0.1
            assert engine.feed(_stream_frame(opt, step, clock.t))
    engine.feed(wire.encode({"kind": "bye", "job": "train", "run": "hog", "rank": 0, "step": 5, "t": clock.t,
                             "opt": "0", "exc": "RuntimeError"}))
    alert = next(a for a in engine.alerts_json() if a["alertname"] == "TrainingCrashed")
    assert "rank 0 raised RuntimeError" in alert["summary"], alert["summary"]
    assert "last values (step 5, 0 s before): loss 0.5" in alert["summary"], alert["summary"]
