"""A script that skips its step on a non-finite loss (``loss.backward()``, then ``if not
torch.isfinite(loss): continue``) is told: the passes it threw away are counted in the next
frame (``skipped_nonfinite``), or in a frame of their own when no step comes any more, and
``TrainingNonFinite`` says the script skipped its step. Passes thrown away with finite
losses (an adversarial attack's, SAM's first) and passes a step does apply (PCGrad's) are
not counted. Real monitors (loss captured at ``backward()``), frames to a real engine."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers import MLP, CaptureSender, make_monitor


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    x = torch.randn(8, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def _skipping(bad: set[int], iterations: int, pause: float = 0.0, set_to_none: bool = True,
              **options: Any) -> tuple[CaptureSender, list[int]]:
    """A loop of ``iterations`` whose iterations in ``bad`` get a NaN in their batch; the
    script skips the step when the loss is not finite. Returns the frames and the
    iterations it skipped."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt, capture_loss=True, **options)
    skipped = []
    try:
        for i in range(1, iterations + 1):
            x, y = _batch(i)
            if i in bad:
                x[0, 0] = math.nan
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=set_to_none)
            loss.backward()
            if not torch.isfinite(loss):
                skipped.append(i)
                time.sleep(pause)
                continue
            opt.step()
    finally:
        mon.close()
    return sender, skipped


def _nonfinite_alerts(sender: CaptureSender) -> list[dict[str, Any]]:
    return [a for a in sender.engine.alerts_json() if a["alertname"] == "TrainingNonFinite"]


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_skipped_step_is_counted_in_the_next_steps_frame_and_pages(set_to_none: bool) -> None:
    """Gradients set to None by the reset, or zeroed in place (``set_to_none=False``: the
    gradient's version counter tells the reset)."""
    sender, skipped = _skipping({6, 7, 12}, 20, set_to_none=set_to_none)
    assert skipped == [6, 7, 12]
    steps = sender.steps()
    assert [f["step"] for f in steps] == list(range(1, 18))  # the script's 17 steps, no more
    counts = {f["step"]: f.get("skipped_nonfinite") for f in steps}
    # iterations 6 and 7 were thrown away before step 6 (iteration 8), 12 before step 10
    assert [counts[s] for s in (5, 6, 9, 10, 17)] == [None, 2, 2, 3, 3]
    assert all(math.isfinite(f["scalars"]["loss"]) for f in steps)  # no NaN in the loss series
    fired = _nonfinite_alerts(sender)
    assert len(fired) == 1 and fired[0]["started_step"] == 6 and fired[0]["last_step"] == 10
    assert "the script skipped its step after 3 backward() passes with a non-finite loss or gradient norm" in fired[0]["summary"]
    labels = (("job", steps[0]["job"]), ("rank", "0"), ("run", steps[0]["run"]), ("source", "loss"))
    assert sender.engine.store.counter("sentinel_nonfinite_total", tuple(sorted(labels))) == 3.0


def test_steps_skipped_for_good_are_told_while_it_goes_on_and_at_the_end() -> None:
    sender, skipped = _skipping(set(range(11, 41)), 40, pause=0.01, heartbeat_seconds=0.1)
    assert len(skipped) == 30
    logs = [f for f in sender.frames if f["kind"] == "log" and "skipped_nonfinite" in f]
    assert len(logs) >= 2 and all(f["step"] == 10 for f in logs)  # the last step's number
    assert logs[0]["skipped_nonfinite"] < 30 and logs[-1]["skipped_nonfinite"] == 30
    assert [f["kind"] for f in sender.frames].index("bye") > sender.frames.index(logs[-1])
    fired = _nonfinite_alerts(sender)
    assert len(fired) == 1 and fired[0]["started_step"] == 10
    assert "after 30 backward() passes" in fired[0]["summary"]


def test_a_clean_run_sends_no_count_and_no_extra_frame() -> None:
    sender, skipped = _skipping(set(), 12, heartbeat_seconds=0.01)
    assert not skipped
    assert not [f for f in sender.frames if "skipped_nonfinite" in f]
    assert [f["kind"] for f in sender.frames].count("log") == 0
    assert not _nonfinite_alerts(sender)


def test_passes_thrown_away_with_finite_losses_or_applied_by_the_step_are_not_counted() -> None:
    """An adversarial step's attack passes (thrown away, finite), and PCGrad's task passes
    (thrown away between resets, then combined by the script and applied: one of them NaN
    makes the step's loss NaN, which the step's own frame reports)."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt, capture_loss=True)
    params = list(model.parameters())
    try:
        for i in range(1, 9):
            x, y = _batch(i)
            for _ in range(2):  # the attack: its gradients are thrown away
                opt.zero_grad()
                nn.functional.mse_loss(model(x + 0.01), y).backward()
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        for i in range(9, 12):  # PCGrad: a backward() per task, gradients kept and combined
            x, y = _batch(i)
            kept = []
            for task in range(2):
                opt.zero_grad()
                target = y * math.nan if (i == 10 and task == 0) else y
                nn.functional.mse_loss(model(x), target).backward()
                kept.append([p.grad.clone() for p in params])
            for p, *gs in zip(params, *kept):
                p.grad = sum(gs)
            opt.step()
    finally:
        mon.close()
    steps = sender.steps()
    assert not [f for f in sender.frames if "skipped_nonfinite" in f]
    assert math.isnan(steps[9]["scalars"]["loss"])  # the step applied the NaN task: its own loss says so


def test_a_gradscalers_skipped_steps_are_not_counted() -> None:
    """A GradScaler skips the step whose gradients overflowed (here a NaN loss): its own
    figures (``amp``: the scale, the skipped steps) report those, not this count."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    mon, sender = make_monitor(model, opt, capture_loss=True, scaler=scaler)
    try:
        for i in range(1, 13):
            x, y = _batch(i)
            if i in (6, 7):
                x[0, 0] = math.nan
            opt.zero_grad()
            scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
            scaler.step(opt)  # skips optimizer.step() for 6 and 7
            scaler.update()
    finally:
        mon.close()
    assert len(sender.steps()) == 10
    assert not [f for f in sender.frames if "skipped_nonfinite" in f]


def test_a_step_skipped_on_a_nonfinite_clipped_norm_is_counted() -> None:
    """The loss is finite, the gradients overflowed (as bf16 or fp16 without a scaler
    can): the script tests what ``clip_grad_norm_`` returned and skips the step."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt, capture_loss=True)
    skipped = []
    try:
        for i in range(1, 13):
            x, y = _batch(i)
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            if i in (5, 9):
                model.head.weight.grad[0, 0] = math.inf
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if not torch.isfinite(norm):
                skipped.append(i)
                continue
            opt.step()
    finally:
        mon.close()
    assert skipped == [5, 9]
    counts = [f.get("skipped_nonfinite") for f in sender.steps()]
    assert counts == [None] * 4 + [1] * 3 + [2] * 3
    fired = _nonfinite_alerts(sender)
    assert len(fired) == 1 and fired[0]["started_step"] == 5


def test_a_nan_pass_that_ends_the_script_on_an_error_is_not_called_a_skip() -> None:
    """The script checks its loss and raises (``raise RuntimeError("loss is NaN")``, or
    anomaly mode's ``Function 'MulBackward0' returned nan values``): the NaN pass's
    gradients were thrown away by the error, not by a skip. The frame that reports them
    names the error, and ``TrainingNonFinite`` says the script ended on it."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt, capture_loss=True)
    error: BaseException | None = None
    try:
        for i in range(1, 9):
            x, y = _batch(i)
            if i == 8:
                x[0, 0] = math.nan
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            if not torch.isfinite(loss):
                raise RuntimeError("loss is NaN")
            opt.step()
    except RuntimeError as e:
        error = e
    finally:
        mon.close(error)
    logs = [f for f in sender.frames if f["kind"] == "log" and "skipped_nonfinite" in f]
    assert len(logs) == 1 and logs[0]["step"] == 7 and logs[0]["skipped_nonfinite"] == 1
    assert logs[0]["exc"].startswith("RuntimeError at test_skipped_nonfinite.py:")
    assert sender.frames[-1]["kind"] == "bye" and sender.frames[-1]["exc"] == logs[0]["exc"]
    fired = _nonfinite_alerts(sender)
    assert len(fired) == 1 and fired[0]["started_step"] == 7
    assert fired[0]["summary"].startswith(f"Non-finite loss (a backward() pass had one, then the script ended on "
                                          f"{logs[0]['exc']} before its step) at step 7 on rank 0")
    assert "skipped its step" not in fired[0]["summary"]
