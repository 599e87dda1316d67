"""Tiny updates of a training that has fitted its data are its success, not a fault:
``UpdateRatioLow`` and ``UpdateNormLow`` hold once the loss is below 1 % of where it
began (``unless_converged``, sentinel/rules/scheduled.py). Where it began is
the engine's: the median of a stream's first 3 finite losses (``Ingested.loss_start``),
again from the step after the script set its weights itself."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.rules.base import Context
from sentinel.rules.scheduled import ScheduledParams, detect
from sentinel.store import Window
from tests.helpers import make_monitor


def _win(values: list[float]) -> Window:
    steps = np.arange(1, len(values) + 1, dtype=np.int64)
    return Window(steps, steps.astype(np.float64), np.asarray(values, dtype=np.float64))


def test_tiny_updates_of_a_loss_below_a_hundredth_of_its_start_get_no_verdict() -> None:
    p = ScheduledParams(op="<", value=1e-4, unless_converged=0.01)
    assert p.reference_samples() == 3 and ScheduledParams(op="<", value=1e-4).reference_samples() == 0
    tiny = _win([5e-5])

    def verdict(loss: list[float] | None, start: float | None) -> object:
        ctx = Context(step=900, now=0.0, loss_start=start, reference_window=None if loss is None else _win(loss))
        return detect(tiny, p, ctx)

    for loss in ([2e-4, 9e-5, 1e-4], [2e-4, 0.5, 1e-4]):  # fitted: 1e-4 of where it began (one batch is no level)
        v = verdict(loss, 1.39)  # quiet, so an alert raised before the fit resolves
        assert v is not None and not v.firing and v.detail == "the loss is below 1% of its start", v  # type: ignore[attr-defined]
    for loss, start in [([1.2, 1.3, 1.25], 1.39), ([0.05, 0.02, 0.03], 1.39), (None, 1.39), ([1e-4] * 3, None),
                        ([1e-4] * 3, -2.0)]:
        v = verdict(loss, start)  # stuck near its start, fallen only 30×, or nothing to compare with: judged
        assert v is not None and v.firing, (loss, start)  # type: ignore[attr-defined]


def _frame(step: int, loss: float, **extra: object) -> bytes:
    return wire.encode({"kind": "step", "job": "j", "run": "r", "rank": 0, "world": 1, "step": step, "t": float(step),
                        "scalars": {"loss": loss}, **extra})


def test_the_engine_takes_the_start_from_the_first_three_finite_losses_and_again_after_a_rewrite() -> None:
    eng = Engine()
    starts = [eng.ingest(wire.decode(_frame(s, v))).loss_start
              for s, v in enumerate([3.0, float("nan"), 1.0, 2.0, 0.1], 1)]
    assert starts == [None, None, None, 2.0, 2.0]  # the median of 3.0, 1.0 and 2.0; the NaN is no value
    assert eng.ingest(wire.decode(_frame(6, 5.0, rewrite="load_state_dict"))).loss_start is None  # begun again
    later = [eng.ingest(wire.decode(_frame(s, v))).loss_start for s, v in [(7, 4.0), (8, 6.0)]]
    assert later == [None, 5.0]


def test_a_classifier_that_memorises_its_data_is_not_told_its_lr_is_too_small() -> None:
    """AdamW at a constant 1e-3 on 256 samples, 4 classes, batches of 32: its loss falls
    from 1.39 to under 1e-3 and its updates fall below 1e-4 of the weights from about step
    800. ``UpdateRatioLow`` warned there (causes: an lr too small, vanishing gradients)."""
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,))), batch_size=32,
                        shuffle=True, generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt)
    losses = []
    try:
        for _ in range(150):
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                mon.log(loss=loss)
                losses.append(loss.item())
    finally:
        mon.close()
    store = sender.engine.store
    ratios = store.window("sentinel_update_mean_abs_ratio", store.labelsets("sentinel_update_mean_abs_ratio")[0], 100)
    assert ratios.values[-1] < 1e-4 and max(losses[-8:]) < 1e-3 * losses[0]  # the case: tiny updates, fitted
    fired = [t.alertname for t in sender.engine.transitions if t.state_to == "firing"]
    assert "UpdateRatioLow" not in fired and "UpdateNormLow" not in fired, fired
