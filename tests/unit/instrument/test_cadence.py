"""Which steps carry the update sample and the SNR (instrument/cadence.py), on real loops."""

from __future__ import annotations

import pytest
import torch

from sentinel.instrument.cadence import LR_JUMP_STEPS
from tests.helpers import MLP, CaptureSender, make_monitor, train_steps


def _sampled(sender: CaptureSender) -> list[int]:
    return [f["step"] for f in sender.steps() if any(d is not None for d in f.get("delta_sumsq") or ())]


def test_defaults_sample_the_first_steps_then_every_100_and_the_snr_in_between(mlp: MLP) -> None:
    opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
    mon, sender = make_monitor(mlp, opt)
    train_steps(mlp, opt, 260, mon)
    mon.close()
    assert _sampled(sender) == [*range(1, 51), 100, 200]
    assert [f["step"] for f in sender.steps() if "grad_l1" in f] == [50, 150, 250]


@pytest.mark.parametrize(("factor", "window"), [(10.0, True), (0.1, True), (2.5, True), (1.8, False)])
def test_an_lr_moved_by_hand_more_than_2x_is_sampled_at_once(mlp: MLP, factor: float, window: bool) -> None:
    """lr x10 (or /10, or x2.5) at step 70: the next LR_JUMP_STEPS steps carry the update's
    size, so UpdateRatioHigh judges the new rate's updates then, not 30 steps later at step
    100 (update_every=50 here). A move under 2x keeps the regular cadence."""
    opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
    mon, sender = make_monitor(mlp, opt, early_steps=0, update_every=50)

    def move_lr(i: int) -> None:
        if i == 69:  # before step 70
            for g in opt.param_groups:
                g["lr"] *= factor

    train_steps(mlp, opt, 110, mon, before_step=move_lr)
    mon.close()
    assert _sampled(sender) == ([50, *range(70, 70 + LR_JUMP_STEPS), 100] if window else [50, 100])
    assert sender.steps()[69]["lr"] == [pytest.approx(1e-3 * factor)]  # the step's report: the rate it applied


def test_a_smooth_schedule_keeps_the_regular_cadence(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=200, eta_min=0.005)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=40)
    mon, sender = make_monitor(mlp, opt, early_steps=10, update_every=50)

    def schedule(i: int) -> None:
        if i:
            sched.step()
            warm.step()

    train_steps(mlp, opt, 200, mon, before_step=schedule)
    mon.close()
    assert _sampled(sender) == [*range(1, 11), 50, 100, 150, 200]
