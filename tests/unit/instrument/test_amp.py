"""AMP: the GradScaler's scale and skipped steps are captured without a sync, and a normal
overflow does not page."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers import MLP, make_monitor


def _amp_run(overflow_at: set[int], steps: int = 30) -> tuple[object, object, torch.amp.GradScaler]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=1000)
    mon, sender = make_monitor(model, opt, scaler=scaler)
    gen = torch.Generator().manual_seed(0)
    for i in range(steps):
        x = torch.randn(8, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        scaler.scale(loss).backward()
        if i in overflow_at:
            model.head.weight.grad[0, 0] = float("inf")  # an fp16 overflow, as GradScaler sees it
        scaler.step(opt)
        scaler.update()
        mon.log(loss=loss)
    mon.close()
    return mon, sender, scaler


def test_scale_and_skipped_steps_are_exported() -> None:
    mon, sender, scaler = _amp_run({10})
    labels = (("job", "train"), ("rank", "0"), ("run", mon.options.run))  # type: ignore[attr-defined]
    store = sender.engine.store  # type: ignore[attr-defined]
    assert store.counter("sentinel_amp_skipped_steps_total", labels) == 1
    last = store.last("sentinel_amp_loss_scale", labels)
    assert last is not None and last[2] == scaler.get_scale() == 2.0**15
    assert mon.steps == 29  # type: ignore[attr-defined]  # the skipped step never reached the optimizer


def test_one_overflow_is_quiet_but_a_collapse_alerts() -> None:
    _, quiet, _ = _amp_run({10}, steps=60)
    fired = {t.alertname for t in quiet.engine.transitions if t.state_to == "firing"}  # type: ignore[attr-defined]
    # this model's batch-8 loss is flat and very noisy: EarlyLossSwing (info, never a page)
    # describes it; nothing that notifies fires
    assert fired <= {"EarlyLossSwing"}
    assert all(t.severity == "info" for t in quiet.engine.transitions)  # type: ignore[attr-defined]
    _, collapse, _ = _amp_run(set(range(20, 60)), steps=60)
    fired = {t.alertname for t in collapse.engine.transitions if t.state_to == "firing"}  # type: ignore[attr-defined]
    assert "LossScaleCollapse" in fired


def _hand_scaled_run(overflow_at: set[int], steps: int = 40) -> tuple[list[float], Any]:
    """A loss scaler of the script's own, as apex's amp, fairseq and DeepSpeed's fp16 write
    it: ``backward()`` on the loss times a Python float, a power of two that doubles every 10
    clean steps and halves at an overflow, whose step is skipped (the gradients are reset at
    the next iteration); the gradients unscaled in place and clipped before the step. Returns
    the losses of the steps taken, as the script logs them, and the sender."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt, capture_loss=True)
    gen = torch.Generator().manual_seed(0)
    scale, clean, logged = 2.0 ** 16, 0, []
    for i in range(steps):
        x = torch.randn(8, 16, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        (loss.float() * scale).backward()
        if i in overflow_at:
            model.head.weight.grad[0, 0] = float("inf")  # an fp16 overflow in the backward pass
        for p in model.parameters():
            p.grad.mul_(1.0 / scale)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        if not torch.isfinite(norm):
            scale, clean = scale / 2, 0
            continue
        opt.step()
        logged.append(float(loss.detach()))
        clean += 1
        if clean % 10 == 0:
            scale *= 2
    mon.close()
    return logged, sender


def test_a_hand_rolled_scalers_loss_is_the_scripts_and_its_overflows_page_no_one() -> None:
    logged, sender = _hand_scaled_run({12, 25})
    got = [f["scalars"]["loss"] for f in sender.steps()]
    assert len(got) == len(logged) == 38
    assert got == pytest.approx(logged, rel=1e-6)  # not 65,536 times it, nor doubling with the scale
    transitions = sender.engine.transitions
    assert all(t.severity == "info" for t in transitions), [(t.alertname, t.summary) for t in transitions]
    assert not any(f.get("skipped_nonfinite") for f in sender.steps())  # an overflow is the scaler's to skip


def test_a_grad_scaler_of_an_earlier_training_is_not_the_next_ones() -> None:
    """An AMP training whose scale collapsed, then one without a ``GradScaler`` in the same
    process (a sweep's next trial, a notebook's next cell): the second exports no scale of
    the first's and pages no ``LossScaleCollapse``."""
    _, first, scaler = _amp_run(set(range(20, 60)), steps=60)
    assert scaler.get_scale() < 1
    assert "LossScaleCollapse" in {t.alertname for t in first.engine.transitions}  # type: ignore[attr-defined]
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt, capture_loss=True)
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        x = torch.randn(8, 16, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
    mon.close()
    assert len(sender.steps()) == 30
    assert [f for f in sender.frames if f.get("amp")] == []
    assert "LossScaleCollapse" not in {t.alertname for t in sender.engine.transitions}


@pytest.mark.parametrize(("make", "scale"), [
    (lambda loss: loss * 2.0 ** 16, 65536.0),  # fairseq, DeepSpeed
    (lambda loss: 2.0 ** 16 * loss, 65536.0),
    (lambda loss: loss.float() * 128.0, 128.0),  # apex's static scale
    (lambda loss: loss * 1024, 1024.0),  # an int
    (lambda loss: loss * torch.tensor(2.0 ** 15), 32768.0),  # a CPU tensor of the script's
    (lambda loss: loss * 0.25, 0.25),  # a power of two: LossSum.add judges it
    (lambda loss: loss, None),
    (lambda loss: loss / 4, None),
    (lambda loss: loss * 1000.0, None),  # a weight, no loss scale
    (lambda loss: loss * torch.ones((), requires_grad=True) * 2.0, 2.0),
    (lambda loss: loss * (torch.ones((), requires_grad=True) * 4.0), None),  # a learned weight
    (lambda loss: (loss * 2.0 ** 16) + 0.0, None),  # not the last operation
])
def test_a_hand_scale_is_a_power_of_two_the_loss_was_last_multiplied_by(make: Any, scale: float | None) -> None:
    from sentinel.instrument.losses import hand_scale

    w = torch.ones(3, requires_grad=True)
    loss = (w * torch.arange(3.0)).square().sum()
    assert hand_scale(make(loss)) == scale


def test_a_hand_scale_never_runs_a_saved_tensor_unpack_hook() -> None:
    """Under ``saved_tensors_hooks`` (offloading, a non-reentrant checkpoint, whose unpack
    recomputes the forward) a saved tensor factor is left unread: reading it would run the
    script's hook outside the backward pass. A Python number is never packed, so apex's
    and fairseq's scales are still read there."""
    from sentinel.instrument.losses import hand_scale

    unpacked: list[int] = []

    def unpack(t: torch.Tensor) -> torch.Tensor:
        unpacked.append(1)
        return t

    w = torch.ones(3, requires_grad=True)
    loss = (w * 2.0).sum()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        by_number = loss * 2.0 ** 16
        by_tensor = loss * torch.tensor(2.0 ** 15)
    assert hand_scale(by_number) == 65536.0
    assert hand_scale(by_tensor) is None
    assert unpacked == []
    by_tensor.backward()  # the script's own backward unpacks it, once
    assert unpacked == [1]


def _captured(factors: list[float]) -> tuple[list[float], list[float]]:
    """Sentinel's step losses and the script's, for steps whose ``backward()`` got the loss
    times ``factors[i]``."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt, capture_loss=True)
    gen = torch.Generator().manual_seed(0)
    logged = []
    for factor in factors:
        x = torch.randn(8, 16, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        (loss * factor).backward()
        opt.step()
        logged.append(float(loss.detach()))
    mon.close()
    return [f["scalars"]["loss"] for f in sender.steps()], logged


def test_a_distillations_temperature_squared_is_part_of_its_loss() -> None:
    """Hinton's distillation loss, ``kl_div(...) * T * T`` at T = 2 or 8: the script's loss
    is the product, a power of two below any loss scaler's first scale."""
    for t2 in (4.0, 64.0):
        got, logged = _captured([t2] * 5)
        assert got == pytest.approx([t2 * v for v in logged], rel=1e-6)


def test_a_loss_scale_that_falls_below_its_first_range_is_still_divided_out() -> None:
    """fairseq's scale starts at 2**7 and halves at each overflow, down to 1e-4: once a loss
    scaler was seen, every power of two it multiplies by is its scale."""
    factors = [128.0, 64.0, 32.0, 1.0, 0.5, 0.125, 0.25]
    got, logged = _captured(factors)
    assert got == pytest.approx(logged, rel=1e-6)
