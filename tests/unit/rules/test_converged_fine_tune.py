"""A regression fine-tuned down to its noise floor pages nothing; the same fine-tune thrown
off by a learning rate raised tenfold pages ``LossDivergence``.

The shape is the evaluation of the public Reptile ports (gabrielhuang/reptile-pytorch): a
sine network meta-trained over 40 tasks, then a copy fine-tuned on a new task by Adam
(``betas=(0, 0.999)``, lr 1e-3) for 1,000 steps of 10 points. Its loss falls from 0.06 to
0.0004 and then wanders between medians of 0.0004 and 0.0011, single batches spread by about
their median: "2.87× the best level" paged ``LossDivergence``, critical, at step 851. Real
monitor, real engine, in this process."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from tests.helpers import make_monitor


def _sine_net() -> nn.Module:
    return nn.Sequential(nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 1))


def _fine_tune(lr_factor_at_600: float) -> tuple[list[tuple[str, str, int]], list[float]]:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)

    def task() -> tuple[float, float]:
        return float(torch.rand(1, generator=gen) * 4.9 + 0.1), float(torch.rand(1, generator=gen) * math.pi)

    def train(net: nn.Module, opt: torch.optim.Optimizer, amplitude: float, phase: float, steps: int,
              losses: list[float] | None = None) -> None:
        for i in range(steps):
            if losses is not None and i == 600:
                for g in opt.param_groups:
                    g["lr"] *= lr_factor_at_600
            x = torch.rand(10, 1, generator=gen) * 10.0 - 5.0
            loss = nn.functional.mse_loss(net(x), amplitude * torch.sin(x + phase))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if losses is not None:
                losses.append(loss.item())

    meta = _sine_net()
    meta_opt = torch.optim.SGD(meta.parameters(), lr=1.0)
    tasks = 40
    for it in range(tasks):  # Reptile: the meta-model moved towards each task's fit (unwatched)
        for g in meta_opt.param_groups:
            g["lr"] = 1.0 - it / tasks
        net = copy.deepcopy(meta)
        train(net, torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.0, 0.999)), *task(), 5)
        for p, q in zip(meta.parameters(), net.parameters()):
            p.grad = (p.data - q.data).clone()
        meta_opt.step()
    net = copy.deepcopy(meta)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.0, 0.999))
    mon, sender = make_monitor(net, opt, capture_loss=True)
    losses: list[float] = []
    try:
        train(net, opt, *task(), 1000, losses)
    finally:
        mon.close()
    fired = [(t.alertname, t.severity, t.step) for t in sender.engine.transitions  # type: ignore[attr-defined]
             if t.state_to == "firing"]
    return fired, losses


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def test_a_fine_tune_at_its_noise_floor_pages_nothing() -> None:
    fired, losses = _fine_tune(1.0)
    # the run is what the docstring says: fitted ~150× down, then wandering 2-3× at the floor
    assert _median(losses[:50]) > 100 * _median(losses[700:750])
    assert _median(losses[800:850]) > 2 * _median(losses[700:750])
    assert [f for f in fired if f[1] in ("warning", "critical")] == [], fired


def test_the_same_fine_tune_thrown_off_by_its_learning_rate_pages_divergence() -> None:
    fired, losses = _fine_tune(10.0)
    assert _median(losses[650:700]) > 50 * _median(losses[550:600])
    assert ("LossDivergence", "critical") in {f[:2] for f in fired}, fired
    assert min(step for name, _, step in fired if name == "LossDivergence") <= 660, fired
