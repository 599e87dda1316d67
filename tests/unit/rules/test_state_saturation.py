"""``OptimizerStateSaturated``: a second moment full of stale large squares that stalls
Adam's updates fires; a second moment that is merely large, with healthy updates, does not.

A small VAE whose loss is the per-sample ELBO (the reconstruction summed over its 32
outputs, as the VAE tutorials write it) holds more than 95 % of its ``exp_avg_sq`` entries
above the saturation level of 1e-3 after a few hundred steps (Adam's stored second moment
grows towards the gradients' mean square over ~1/(1-β2) steps), while Adam, which divides
its step by √v, updates the weights by about 1e-3 of their size per step. The rule warned
on it at step 300. Real monitors, real Adam, a real engine, in this process."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tests.helpers import make_monitor

RULE = "OptimizerStateSaturated"


def _series(sender: object, metric: str) -> list[float]:
    store = sender.engine.store  # type: ignore[attr-defined]
    values: list[float] = []
    for labels in store.labelsets(metric):
        window = store.window(metric, labels, 10_000)
        values += window.values.tolist()
    return values


def _step(loss: torch.Tensor, opt: torch.optim.Optimizer, mon: object) -> None:
    opt.zero_grad()
    loss.backward()
    opt.step()
    mon.log(loss=loss)  # type: ignore[attr-defined]


def _fired(sender: object) -> list[tuple[str, int]]:
    return [(t.alertname, t.step) for t in sender.engine.transitions if t.state_to == "firing"]  # type: ignore[attr-defined]


def test_a_vae_with_a_summed_loss_fills_its_second_moment_and_pages_nothing() -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    basis = torch.randn(4, 32, generator=gen)
    encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    decoder = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 32))
    opt = torch.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()), lr=1e-3)
    mon, sender = make_monitor(nn.ModuleList([encoder, decoder]), opt, state_every=10, update_every=10)
    try:
        for _ in range(400):
            x = torch.randn(64, 4, generator=gen) @ basis + 0.1 * torch.randn(64, 32, generator=gen)
            mu, logvar = encoder(x).chunk(2, dim=1)
            z = mu + torch.randn(mu.shape, generator=gen) * (0.5 * logvar).exp()
            recon = F.mse_loss(decoder(z), x, reduction="sum") / x.shape[0]
            kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / x.shape[0]
            _step(recon + kl, opt, mon)
    finally:
        mon.close()
    saturation = _series(sender, "sentinel_optimizer_state_saturation_ratio")
    updates = _series(sender, "sentinel_update_ratio")
    # what the rule sees: a full second moment for the last 100 steps, updates far from stalled
    assert len(saturation) >= 30 and min(saturation[-10:]) > 0.95, saturation
    assert min(updates[-10:]) > 5e-4, updates
    assert [f for f in _fired(sender) if f[0] == RULE] == []


def test_a_second_moment_that_remembers_larger_gradients_and_stalls_the_updates_fires() -> None:
    """The same squares, but stale: a loss weighted 1e4 for 150 steps (an auxiliary term
    ramped down, a burst of large gradients), then 1e-2. Adam's β2 of 0.999 keeps the old
    squares for thousands of steps, so its steps shrink ~1e4-fold: the updates stall."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    target = torch.randn(32, 1, generator=gen)
    mon, sender = make_monitor(model, opt, state_every=10, update_every=10)
    try:
        for step in range(1, 401):
            x = torch.randn(64, 32, generator=gen)
            weight = 1e4 if step <= 150 else 1e-2
            _step(weight * F.mse_loss(model(x), x @ target), opt, mon)
    finally:
        mon.close()
    updates = _series(sender, "sentinel_update_ratio")
    assert max(updates[-5:]) < 1e-4, updates
    fired = [step for name, step in _fired(sender) if name == RULE]
    assert fired and 150 < fired[0] <= 260, _fired(sender)
