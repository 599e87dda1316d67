"""Trainings of one process one after the other (knowledge distillation: a teacher trained,
then a student on its soft targets; a script's second experiment). The student's monitor
reports on the teacher's stream, which the engine reads as the stream starting over; the
teacher's monitor stays alive until the script ends.

When the student's ``backward()`` raised on a NaN loss (anomaly mode's "Function
'LogBackward0' returned nan values"), the teacher's monitor, closed at exit, reported that
loss as a step its script skipped, at the teacher's last step, and then a crash's goodbye:
the engine paged the crash twice, and the history opened a third run of 0 steps for the
student's last report. Real monitors (loss captured at ``backward()``), frames to a real
engine."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from sentinel.instrument import registry
from sentinel.instrument.monitor import Monitor
from tests.helpers import MLP, CaptureSender, make_monitor, train_steps

pytestmark = [pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled"),
              pytest.mark.filterwarnings("ignore:Error detected in MulBackward0")]


def _nan_backward(model: nn.Module) -> RuntimeError:
    """A backward() that raises on its NaN loss, as anomaly mode's does."""
    x = torch.randn(8, 16)
    loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)) * torch.log(torch.tensor(-1.0))
    with torch.autograd.detect_anomaly(check_nan=True), pytest.raises(RuntimeError, match="nan values") as info:
        loss.backward()
    return info.value


Watched = tuple[nn.Module, torch.optim.Optimizer, Monitor]


def _watched_up_front() -> tuple[Watched, Watched, CaptureSender]:
    """Two models, an Adam each, and their monitors, both made before either reported
    (streams "0" and "1"), to one engine."""
    torch.manual_seed(0)
    out: list[Watched] = []
    sender: CaptureSender | None = None
    for _ in range(2):
        model = MLP(width=16)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        mon, sender = make_monitor(model, opt, sender=sender, capture_loss=True)
        out.append((model, opt, mon))
    assert sender is not None
    return out[0], out[1], sender


def _close_all(monitors: list[Monitor], error: BaseException) -> None:
    for mon in monitors:  # as the script's exit closes them: in the order they were made
        mon.close(error)


def test_a_student_crashing_on_a_nan_is_paged_once_and_its_teacher_says_nothing_more() -> None:
    torch.manual_seed(0)
    teacher, student = MLP(width=16), MLP(width=16)
    t_opt = torch.optim.Adam(teacher.parameters(), lr=1e-3)
    mon_t, sender = make_monitor(teacher, t_opt, capture_loss=True)
    train_steps(teacher, t_opt, 6, seed=1)
    s_opt = torch.optim.Adam(student.parameters(), lr=1e-3)
    mon_s, _ = make_monitor(student, s_opt, sender=sender, capture_loss=True)
    train_steps(student, s_opt, 4, seed=2)
    assert registry.stream_taken(mon_t) and not registry.stream_taken(mon_s)

    error = _nan_backward(student)
    _close_all([mon_t, mon_s], error)

    assert [(f["kind"], f["step"]) for f in sender.frames if f["kind"] != "step"] == [("log", 4), ("bye", 4)]
    assert [f["step"] for f in sender.steps()] == [1, 2, 3, 4, 5, 6, 1, 2, 3, 4]
    log, bye = [f for f in sender.frames if f["kind"] != "step"]
    assert log["skipped_nonfinite"] == 1  # the student's pass that raised, at the student's step
    assert bye["exc"].startswith("RuntimeError at ")
    alerts = sender.engine.alerts_json()
    assert sorted((a["alertname"], a["started_step"]) for a in alerts) == [("TrainingCrashed", 4), ("TrainingNonFinite", 4)]
    assert sender.engine.restarts == 1  # the student's step 1; nothing after it began the stream again


def test_optimizers_that_take_turns_each_keep_their_stream_and_their_last_losses() -> None:
    """A GAN's two optimizers (each its own ``watch``, made before either reported) step in
    turn: neither training is over when the other steps, so a crash on a NaN in the
    generator's ``backward()`` is each stream's to tell, as before."""
    (gen, g_opt, mon_g), (disc, d_opt, mon_d), sender = _watched_up_front()
    for i in range(4):
        train_steps(disc, d_opt, 1, seed=10 + i)
        train_steps(gen, g_opt, 1, seed=20 + i)
    assert not registry.stream_taken(mon_g) and not registry.stream_taken(mon_d)
    train_steps(disc, d_opt, 1, seed=30)
    error = _nan_backward(gen)
    _close_all([mon_g, mon_d], error)

    byes = {f["opt"]: f for f in sender.frames if f["kind"] == "bye"}
    assert sorted(byes) == ["0", "1"] and all(b["exc"].startswith("RuntimeError at ") for b in byes.values())
    skipped = {f["opt"]: f["skipped_nonfinite"] for f in sender.frames if f["kind"] == "log"}
    assert skipped == {"0": 1, "1": 1}
    assert all(math.isfinite(f["scalars"]["loss"]) for f in sender.steps())


def test_a_training_that_steps_on_after_a_later_one_took_its_stream_gets_a_stream_of_its_own() -> None:
    """A discriminator trained alone first, then the generator's optimizer made for the game
    (SRGAN's generator pretrained, then its discriminator): the later monitor reports as the
    process's stream, as a distilled student does, but the earlier one steps on beside it.
    Its steps went on under the same stream, interleaved with the later one's (the engine read
    each switch as the stream going back, the history merged them into one run of 260 steps);
    they now go to a stream of their own from the step it stepped again."""
    torch.manual_seed(0)
    disc, gen = MLP(width=16), MLP(width=16)
    d_opt = torch.optim.Adam(disc.parameters(), lr=1e-3)
    mon_d, sender = make_monitor(disc, d_opt)
    train_steps(disc, d_opt, 5, seed=1)
    g_opt = torch.optim.Adam(gen.parameters(), lr=1e-3)
    mon_g, _ = make_monitor(gen, g_opt, sender=sender)
    for i in range(4):
        train_steps(disc, d_opt, 1, seed=10 + i)
        train_steps(gen, g_opt, 1, seed=20 + i)
    assert not registry.stream_taken(mon_d)
    mon_d.close()
    mon_g.close()

    steps = [(f.get("opt", ""), f["step"]) for f in sender.frames if f["kind"] == "step"]
    assert steps == [("", 1), ("", 2), ("", 3), ("", 4), ("", 5), ("", 6), ("", 1),
                     ("1", 7), ("", 2), ("1", 8), ("", 3), ("1", 9), ("", 4)]
    assert sorted((f.get("opt", ""), f["step"]) for f in sender.frames if f["kind"] == "bye") == [("", 4), ("1", 9)]
    assert sender.engine.restarts == 1  # the generator's step 1: nothing after it went back


def test_a_nan_that_crashes_the_student_is_not_its_finished_teachers_when_both_have_streams() -> None:
    """Both optimizers made before either reported (zero-code mode finds them alive at its
    first attach; two ``watch`` calls up front): teacher and student have streams of their own,
    "0" and "1", and the student's ``backward()`` that raised on its NaN reached the teacher's
    loss sum too. The teacher's training was long over: its stream reported no skipped pass."""
    (teacher, t_opt, mon_t), (student, s_opt, mon_s), sender = _watched_up_front()
    train_steps(teacher, t_opt, 6, seed=1)
    train_steps(student, s_opt, 4, seed=2)
    error = _nan_backward(student)
    _close_all([mon_t, mon_s], error)

    assert {f["opt"] for f in sender.steps()} == {"0", "1"}
    skipped = {f["opt"]: f["skipped_nonfinite"] for f in sender.frames if f["kind"] == "log"}
    assert skipped == {"1": 1}  # the student's, none of the teacher's
