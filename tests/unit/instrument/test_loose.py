"""Single-element tensors no module holds: coefficients (SAC's entropy temperature
``log_alpha``, which starts at 0, a Lagrange multiplier). Their relative change has no
weight's scale to be judged against, so the update-size figures leave them out; and an
optimizer that steps only such scalars tunes coefficients, whose loss settles around 0 with
either sign: what its ``backward()`` got is the scalar ``objective``, which no loss rule
judges (tests/programs/sac.py: it fired EarlyLossRising and EarlyUpdateTooLarge, both
critical). Loose tensors of more elements (a functional training's weights in a dict) keep
every figure. Real monitors, real optimizers, frames to a real engine."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers import MLP, make_monitor


class Temperature(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.zeros(1))


@pytest.mark.parametrize("held", [False, True])
def test_an_optimizer_of_a_loose_scalar_records_an_objective_and_no_update_size(held: bool) -> None:
    """SAC's temperature, as CleanRL and Stable-Baselines3 keep it (a bare tensor from 0),
    against the same scalar held by a module, which stays a parameter like any other."""
    torch.manual_seed(0)
    module = Temperature() if held else None
    log_alpha = module.log_alpha if module is not None else torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([log_alpha], lr=1e-2)
    mon, sender = make_monitor(module, opt, capture_loss=True, update_every=1)
    values = []
    try:
        for i in range(12):
            log_pi = torch.full((8, 1), -0.5 + 0.1 * i)  # the policy grows surer: its entropy falls
            alpha_loss = (-log_alpha.exp() * (log_pi + -1.0)).mean()
            values.append(float(alpha_loss.detach()))
            opt.zero_grad()
            alpha_loss.backward()
            opt.step()
    finally:
        mon.close()
    frames = sender.steps()
    assert len(frames) == 12
    name, other = ("loss", "objective") if held else ("objective", "loss")
    assert [f["scalars"][name] for f in frames] == pytest.approx(values)
    assert all(other not in f["scalars"] for f in frames)
    assert all(f["grad_sumsq"] for f in frames)  # its gradient is read either way
    assert all(any(v is not None for v in f.get("delta_sumsq", [])) for f in frames) is held
    store = sender.engine.store
    assert bool(store.labelsets("sentinel_loss")) is held
    assert bool(store.labelsets("sentinel_update_mean_abs_ratio")) is held


def test_a_loose_tensor_beside_a_model_is_left_out_of_the_update_size_only() -> None:
    """A bare learned temperature in the model's optimizer: the update figures are the
    model's weights' alone, its gradient still counts in the norm, and the loss is a loss."""
    torch.manual_seed(0)
    model = MLP()
    scale = nn.Parameter(torch.zeros(()))  # starts at 0: its own ratio would be 1 at every early step
    opt = torch.optim.Adam([{"params": model.parameters()}, {"params": [scale]}], lr=1e-2)
    mon, sender = make_monitor(model, opt, capture_loss=True, update_every=1)
    old: dict[str, torch.Tensor] = {}
    ratios, norms = [], []
    gen = torch.Generator().manual_seed(0)
    try:
        for _ in range(5):
            x = torch.randn(8, 16, generator=gen)
            loss = nn.functional.mse_loss(model(x) * scale.exp(), x.sum(dim=1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            norms.append(float(torch.linalg.vector_norm(torch.stack(
                [p.grad.norm() for p in [*model.parameters(), scale]]))))
            old = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt.step()
            ratios.append(sum(float((p.detach() - old[n]).abs().sum()) for n, p in model.named_parameters())
                          / sum(float(w.abs().sum()) for w in old.values()))
    finally:
        mon.close()
    frames = sender.steps()
    assert "loss" in frames[-1]["scalars"]
    base = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    store = sender.engine.store
    uars, grad = store.window("sentinel_update_mean_abs_ratio", base), store.window("sentinel_grad_norm", base)
    assert uars is not None and grad is not None
    assert list(uars.values) == pytest.approx(ratios, rel=1e-4)
    assert list(grad.values) == pytest.approx(norms, rel=1e-4)
    assert "optimizer0.group1" in frames[-1]["groups"]  # the temperature keeps its group and its norms


def test_a_functional_trainings_loose_weights_keep_their_update_size() -> None:
    """``torch.func.functional_call`` over a dict of leaf tensors: no module holds them, and
    they are the weights; the last layer's single-element bias is the only one left out."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
    params = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    opt = torch.optim.AdamW(params.values(), lr=1e-2)
    mon, sender = make_monitor(None, opt, capture_loss=True, update_every=1)
    gen = torch.Generator().manual_seed(0)
    try:
        for _ in range(3):
            x = torch.randn(16, 5, generator=gen)
            loss = nn.functional.mse_loss(torch.func.functional_call(model, params, (x,)), x.sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        mon.close()
    frames = sender.steps()
    assert all("loss" in f["scalars"] and any(v is not None for v in f["delta_sumsq"]) for f in frames)
