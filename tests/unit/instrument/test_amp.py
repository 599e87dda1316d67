"""AMP: the GradScaler's scale and skipped steps are captured without a sync, and a normal
overflow does not page."""

from __future__ import annotations

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
