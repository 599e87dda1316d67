"""An evaluation is no stall: a rank's heartbeats (``beat`` on a log frame, sent while it runs
forward passes and takes no step) move the point TrainingStalled counts its silence from.

Real engine, real frames (wire-encoded), the engine's clock set by the test.
"""

from __future__ import annotations

import os
from typing import Any

from sentinel import wire
from sentinel.engine.engine import Engine
from tests.unit.engine.test_crash import Clock

HEARTBEAT = "sentinel_last_heartbeat_timestamp_seconds"


def _step(rank: int, step: int, t: float, **extra: Any) -> bytes:
    return wire.encode({"kind": "step", "job": "train", "run": "r1", "rank": rank, "world": 2, "step": step,
                        "t": t, "groups": ["a"], "grad_sumsq": [1.0], "step_seconds": 0.5,
                        "scalars": {"loss": 1.0}, **extra})


def _beat(rank: int, step: int, t: float, beats: int, **extra: Any) -> bytes:
    return wire.encode(wire.Frame(kind="log", job="train", run="r1", rank=rank, world=2, step=step, t=t,
                                  beat=beats, **extra))


def _trained(steps: int = 100) -> tuple[Engine, Clock]:
    clock = Clock()
    engine = Engine(clock=clock)
    for step in range(1, steps + 1):
        clock.t += 0.5
        for rank in (0, 1):
            assert engine.feed(_step(rank, step, clock.t))
    return engine, clock


def _stalled(engine: Engine) -> dict[str, Any] | None:
    return next((a for a in engine.alerts_json() if a["alertname"] == "TrainingStalled"), None)


def test_heartbeats_hold_off_training_stalled_and_a_hang_after_them_fires_it() -> None:
    engine, clock = _trained()
    last_step = clock.t
    for _ in range(45):  # a 15-minute evaluation: a heartbeat each 20 s from both ranks
        clock.t += 20
        for rank in (0, 1):
            assert engine.feed(_beat(rank, 100, clock.t, beats=500))
        engine.tick()
    assert clock.t - last_step == 900 > 600  # the limit: max(600 s, 20 × 0.5 s)
    assert _stalled(engine) is None
    assert engine.store.last(HEARTBEAT, (("job", "train"), ("rank", "0"), ("run", "r1")))[2] == clock.t
    last_beat = clock.t
    clock.t += 590
    engine.tick()
    assert _stalled(engine) is None
    clock.t += 20  # the ranks hung after their evaluation: 610 s since the last heartbeat
    engine.tick()
    alert = _stalled(engine)
    assert alert is not None and alert["state"] == "firing" and alert["ranks"] == [0, 1]
    assert alert["value"] == clock.t - last_beat == 610
    assert "no step for 1510 s, the run's last heartbeat 610 s ago (limit 600 s)" in alert["summary"], alert["summary"]


def test_a_heartbeat_resolves_a_stall_at_once_and_without_one_the_stall_fires() -> None:
    engine, clock = _trained()
    clock.t += 700
    engine.tick()
    alert = _stalled(engine)
    assert alert is not None and alert["state"] == "firing"
    assert "no step for 700 s (limit 600 s)" in alert["summary"]
    for rank in (0, 1):  # the evaluation's first heartbeat: no tick needed to end it
        assert engine.feed(_beat(rank, 100, clock.t, beats=3))
    alert = _stalled(engine)
    assert alert is not None and alert["state"] == "resolved"


def test_while_rank_0_evaluates_alone_the_ranks_waiting_for_it_are_not_stalled() -> None:
    engine, clock = _trained()
    for _ in range(40):  # 800 s: rank 0 evaluates, rank 1 waits for it in a barrier
        clock.t += 20
        assert engine.feed(_beat(0, 100, clock.t, beats=100))
        engine.tick()
    assert _stalled(engine) is None
    clock.t += 601  # rank 0 hung after its evaluation: the whole run is stalled now
    engine.tick()
    alert = _stalled(engine)
    assert alert is not None and alert["state"] == "firing" and alert["ranks"] == [0, 1]


def test_a_heartbeat_of_one_optimizer_stream_counts_for_its_process() -> None:
    clock = Clock()
    engine = Engine(clock=clock)
    for step in range(1, 51):
        clock.t += 0.5
        for opt in ("0", "1"):  # a GAN's two optimizers in one process
            assert engine.feed(_step(0, step, clock.t, opt=opt))
    clock.t += 300
    assert engine.feed(_beat(0, 50, clock.t, beats=10, opt="0"))  # the generator's model evaluates
    clock.t += 400
    engine.tick()
    assert _stalled(engine) is None  # 700 s without a step, 400 s since the process's heartbeat
    clock.t += 201
    engine.tick()
    alert = _stalled(engine)
    assert alert is not None and alert["optimizers"] == ["0", "1"], alert


def _phases(pids: tuple[int | None, int | None]) -> tuple[Engine, Clock]:
    """Two optimizers of rank 0 trained one after the other, as the PyTorch examples'
    Forward-Forward trains each layer by its own Adam in turn: optimizer "0" for 50 steps,
    then "1" for 800 s (each optimizer's frames from process ``pids[i]``, None: unknown)."""
    clock = Clock()
    engine = Engine(clock=clock)
    for step in range(1, 51):
        clock.t += 0.5
        assert engine.feed(_step(0, step, clock.t, opt="0"), pid=pids[0])
    for step in range(1, 801):
        clock.t += 1.0
        assert engine.feed(_step(0, step, clock.t, opt="1"), pid=pids[1])
        if step % 20 == 0:
            engine.tick()
    return engine, clock


def test_an_optimizer_done_while_another_of_its_process_trains_is_not_stalled() -> None:
    for pids in ((None, None), (os.getpid(), os.getpid())):  # the in-process engine knows no pid; the daemon does
        engine, clock = _phases(pids)
        assert _stalled(engine) is None, pids  # "0" silent for 800 s while "1" stepped
        clock.t += 601  # then the process hangs: both streams stopped
        engine.tick()
        alert = _stalled(engine)
        assert alert is not None and alert["state"] == "firing" and alert["optimizers"] == ["0", "1"], alert


def test_an_optimizer_of_another_process_stepping_does_not_hide_a_hang() -> None:
    # Hogwild: each worker a process of its own, both rank 0; worker "0" hung at step 50
    engine, _ = _phases((os.getpid(), os.getppid()))
    alert = _stalled(engine)
    assert alert is not None and alert["optimizers"] == ["0"], alert
    assert "no step for" in alert["summary"] and "another optimizer" not in alert["summary"]


def _where(rank: int, step: int, t: float, where: str) -> bytes:
    return wire.encode(wire.Frame(kind="log", job="train", run="r1", rank=rank, world=2, step=step, t=t, where=where))


def test_a_stall_says_where_each_ranks_thread_waits_until_it_steps_again() -> None:
    """Where a rank's training thread was once no step came (the instrument's ``where``) ends
    the stall's detail; it is no heartbeat, and the next step forgets it."""
    engine, clock = _trained()
    clock.t += 40
    assert engine.feed(_where(0, 100, clock.t, "all_reduce (torch/distributed/distributed_c10d.py:2501) "
                                              "from train_step (train.py:88)"))
    assert engine.feed(_where(1, 100, clock.t, "_next_data (torch/utils/data/dataloader.py:1300) "
                                              "from main (train.py:120)"))
    clock.t += 570  # 610 s since the last step: the where frames held off nothing
    engine.tick()
    alert = _stalled(engine)
    assert alert is not None and alert["ranks"] == [0, 1]
    # each rank's place, named: the one in the collective, and the one that never reached it
    assert "its training thread is in all_reduce (torch/distributed/distributed_c10d.py:2501) from train_step" \
           " (train.py:88) (rank 0)" in alert["summary"], alert["summary"]
    assert "its training thread is in _next_data (torch/utils/data/dataloader.py:1300) from main (train.py:120)" \
           " (rank 1)" in alert["summary"], alert["summary"]
    for rank in (0, 1):  # they step again, then stall again without saying where
        assert engine.feed(_step(rank, 101, clock.t))
    clock.t += 700
    engine.tick()
    again = _stalled(engine)
    assert again is not None and again["state"] == "firing" and again["step"] == 101
    assert "training thread" not in again["summary"], again["summary"]
