"""A rank whose training begins again at step 1 starts over (``wire.starts_over``): the next
fold of a k-fold loop (a new model and optimizer in the same process, its monitor counting
from step 1 again), a notebook cell run again. Its series, rule state and alerts start
over, so no rule reads the new training's first, high losses against the old one's last,
low ones. A restart from a checkpoint goes on from the checkpoint's step: not a new start.
"""

from __future__ import annotations

import random
from typing import Any

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.store import labels_of

RANK0 = labels_of(job="j", run="kfold", rank=0)


def _frame(step: int, loss: float, t: float, **extra: Any) -> bytes:
    return wire.encode({"kind": "step", "job": "j", "run": "kfold", "rank": 0, "world": 1, "step": step, "t": t,
                        "groups": ["a", "b"], "grad_sumsq": [loss, loss / 2], "scalars": {"loss": loss},
                        "lr": [1e-3], **extra})


def _fold(engine: Engine, steps: int, t0: float, nan_at: int | None = None) -> float:
    """A fold's training from step 1: the loss falls from about 60 to 0.5, with noise."""
    rnd = random.Random(0)
    t = t0
    for step in range(1, steps + 1):
        t += 0.1
        loss = float("nan") if step == nan_at else 0.5 + 60.0 * 0.93 ** step * (1 + 0.3 * rnd.random())
        assert engine.feed(_frame(step, loss, t))
    return t


def _fired(engine: Engine) -> list[str]:
    return [t.alertname for t in engine.transitions if t.state_to == "firing" and t.severity != "info"]


def test_a_second_fold_from_step_1_is_a_new_training_not_an_explosion_of_the_first() -> None:
    engine = Engine()
    t = _fold(engine, 80, 1000.0)
    assert _fired(engine) == [] and engine.restarts == 0
    _fold(engine, 60, t)
    # judged against the first fold's last values, the same curve again is a critical
    # LossDivergence (and on a real k-fold script an EarlyLossExplosion too)
    assert _fired(engine) == [], _fired(engine)
    assert engine.restarts == 1
    window = engine.store.window("sentinel_loss", RANK0)
    assert window is not None and window.steps.tolist() == list(range(1, 61))  # the second fold's only
    last = engine.store.last("sentinel_step", RANK0)
    assert last is not None and last[0] == 60 and last[2] == 60.0


def test_an_old_trainings_alert_resolves_when_the_rank_starts_over() -> None:
    engine = Engine()
    t = _fold(engine, 60, 1000.0, nan_at=60)
    assert "TrainingNonFinite" in _fired(engine)
    _fold(engine, 5, t)
    resolved = [tr for tr in engine.transitions if tr.alertname == "TrainingNonFinite" and tr.state_to == "resolved"]
    assert len(resolved) == 1
    assert not [a for a in engine.rules.active() if a["alertname"] == "TrainingNonFinite"]


def test_steps_that_repeat_go_on_or_go_back_to_a_checkpoint_are_not_a_new_start() -> None:
    engine = Engine()
    t = _fold(engine, 30, 1000.0)
    assert engine.feed(_frame(30, 0.6, t + 0.1))  # the same step again (a log frame's step, a retry)
    assert engine.feed(_frame(31, 0.6, t + 0.2))
    assert engine.feed(_frame(21, 0.7, t + 0.3))  # a restart from step 20's checkpoint goes on from there
    assert engine.restarts == 0
    window = engine.store.window("sentinel_loss", RANK0)
    assert window is not None and len(window) == 33


def test_a_stream_that_said_goodbye_and_reports_again_is_a_new_training_whatever_its_step() -> None:
    """Zero-code mode watches a task's model late, after a series of short trainings, with its
    steps going on from its optimizer's own count: its stream said goodbye with the last
    task's, and the task's losses are no baseline of the new training's."""
    engine = Engine()
    t = _fold(engine, 30, 1000.0)
    assert engine.feed(wire.encode({"kind": "bye", "job": "j", "run": "kfold", "rank": 0, "world": 1, "step": 30,
                                    "t": t + 0.1}))
    assert engine.feed(_frame(125, 0.6, t + 5.0))
    assert engine.feed(_frame(126, 0.6, t + 5.1))
    assert engine.restarts == 1
    window = engine.store.window("sentinel_loss", RANK0)
    assert window is not None and window.steps.tolist() == [125, 126]  # the new training's only


def test_each_new_training_of_a_stream_gets_the_group_names_it_reports() -> None:
    """An architecture search in one process: five models in turn, each of 60 cells named
    after its trial (``t3_cell17``), 300 group names over the stream's life. Each new
    training keeps its groups, their norms and its gradient norm. The engine counted the
    distinct names of a rank over every training it had, so from the fifth one on (past 256
    names) it dropped the groups of every frame, and with them the gradient norm."""
    engine = Engine()
    t = 1000.0
    for trial in range(5):
        groups = [f"t{trial}_cell{i}" for i in range(60)]
        for step in (1, 2, 3):
            t += 0.1
            assert engine.feed(wire.encode({"kind": "step", "job": "j", "run": "kfold", "rank": 0, "world": 1,
                                            "step": step, "t": t, "groups": groups, "grad_sumsq": [1.0] * 60,
                                            "scalars": {"loss": 1.0}}))
        norm = engine.store.last("sentinel_grad_norm", RANK0)
        assert norm is not None and norm[0] == 3 and norm[1] == t and norm[2] == 60 ** 0.5, trial
        cell = engine.store.last("sentinel_group_grad_norm", labels_of(job="j", run="kfold", rank=0, group=groups[-1]))
        assert cell is not None and cell[1] == t, trial
    assert engine.fields_dropped == {}
