"""An epoch's short last batch (``drop_last=False``, the default): 1,025 samples in batches
of 64 end each epoch with a batch of one, whose gradient norm is about eight times the
others' (one sample's noise) and whose loss is one sample's. The step that takes it says
so (``short_batch``: [size, batch size]), and the spike rules and the gradient noise
ratio leave it out (a probe shaped so paged GradientSpike and GradientNoiseRising).
Real DataLoaders (with forked workers too), real monitors, a real engine."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.rules.config import load_pack
from tests.helpers import MLP, make_monitor


def _train(n: int, drop_last: bool = False, workers: int = 0, epochs: int = 2) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(n, 16), torch.randn(n, 1))
    loader = DataLoader(data, batch_size=64, shuffle=True, drop_last=drop_last, num_workers=workers,
                        generator=torch.Generator().manual_seed(0))
    evaluation = DataLoader(data, batch_size=100)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt)
    try:
        for _ in range(epochs):
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                mon.log(loss=loss)
            with torch.no_grad():  # an evaluation's loader between the epochs changes nothing
                for x, _ in evaluation:
                    model(x)
    finally:
        mon.close()
    return sender.steps()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_step_of_an_epochs_short_last_batch_says_so(workers: int) -> None:
    """With workers, batches are asked for ahead of the loop (prefetch): the step still
    names the batch the loop took."""
    frames = _train(1025, workers=workers)
    short = {f["step"]: f["short_batch"] for f in frames if "short_batch" in f}
    assert len(frames) == 34
    assert short == {17: [1, 64], 34: [1, 64]}


@pytest.mark.parametrize(("n", "drop_last"), [(1025, True), (1056, False), (1024, False)],
                         ids=["drop_last", "half-a-batch", "no-remainder"])
def test_no_short_batch_otherwise(n: int, drop_last: bool) -> None:
    frames = _train(n, drop_last=drop_last, epochs=1)
    assert frames and not any("short_batch" in f for f in frames)


def _frames(flagged: bool) -> list[bytes]:
    """A run whose gradient norm is 1 ± 5 % per batch and 8 at each epoch's last batch of one."""
    out = []
    for step in range(1, 341):
        short = step % 17 == 0
        norm = 8.0 if short else 1.0 + 0.05 * math.sin(step * 1.7)
        f: dict[str, Any] = {"kind": "step", "job": "j", "run": f"short-{flagged}", "rank": 0, "step": step,
                             "t": float(step), "groups": ["w"], "grad_sumsq": [norm * norm],
                             "scalars": {"loss": 1.0 / math.sqrt(step) * (3.0 if short else 1.0)}}
        if short and flagged:
            f["short_batch"] = [1, 64]
        out.append(wire.encode(f))
    return out


@pytest.mark.parametrize("flagged", [True, False])
def test_the_spike_rules_and_gvr_leave_a_short_batch_out(flagged: bool) -> None:
    """An epoch's short batch comes every epoch, so from the third on the spike rules take
    it for the script's schedule too (``skip_periodic``), and once they make 5 % of the
    baseline for one of the series' levels (``max_share``); both are off here, so the flag
    alone is what keeps them quiet (and it keeps quiet the first two epochs' as well)."""
    spikes = {"GradientSpike", "LossSpike", "GradientNoiseRising"}
    off = {"skip_periodic": False, "max_share": 0.0}
    eng = Engine(pack=load_pack({"rules": {name: {"params": off} for name in spikes}}))
    for data in _frames(flagged):
        assert eng.feed(data)
    fired = {t.alertname for t in eng.transitions if t.state_to == "firing"}
    assert bool(fired & spikes) is not flagged, fired
    gvr = eng.store.window("sentinel_gradient_variance_ratio", (("job", "j"), ("rank", "0"), ("run", f"short-{flagged}")))
    assert gvr is not None and (float(max(gvr.values)) < 0.01) is flagged  # the ones alone: no variance to speak of
