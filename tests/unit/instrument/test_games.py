"""Optimizers in a game (sentinel/instrument/games.py): a GAN's generator loss runs through
the discriminator and rises as the discriminator learns, and the discriminator's rises as
the generator gets better, so neither is judged as a loss: both are the scalar
``objective`` once the second round shows the game, and the engine drops the first round's
loss series (tests/programs/sngan.py: a 2-D GAN that converged paged EarlyLossRising,
critical, at step 87). Optimizers that share one ``backward()`` are no game, nor are a
fine-tuning script's stages. Real monitors, real 2-D GANs on the CPU, frames to a real
engine."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.helpers import CaptureSender, make_monitor


def _gan(steps: int, log: bool = False, freeze: bool = False, critic: int = 1,
         **options: Any) -> tuple[CaptureSender, list[list[float]], list[Any]]:
    """The PyTorch examples' DCGAN loop on 2-D data: the discriminator's Adam made and
    stepped first, ``detach()`` of the fake batch for its update, the non-saturating BCE
    loss for the generator. Two monitors before any report, as two ``watch()`` calls.
    ``freeze``: the discriminator's ``requires_grad`` off for the generator's step, on for
    its own ``critic`` steps (the original WGAN's loop, pix2pix's ``set_requires_grad``)."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
    D = nn.Sequential(nn.Linear(2, 128), nn.LeakyReLU(0.2), nn.Linear(128, 128), nn.LeakyReLU(0.2), nn.Linear(128, 1))
    opt_d = torch.optim.Adam(D.parameters(), 2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(G.parameters(), 2e-4, betas=(0.5, 0.999))
    sender = CaptureSender()
    mons = [make_monitor(D, opt_d, sender, capture_loss=not log, **options)[0],
            make_monitor(G, opt_g, sender, capture_loss=not log, **options)[0]]
    values: list[list[float]] = [[], []]
    gen = torch.Generator().manual_seed(1)
    ones, zeros = torch.ones(128, 1), torch.zeros(128, 1)
    scale, shift = torch.tensor([0.3, 1.0]), torch.tensor([2.0, 0.0])
    try:
        for _ in range(steps):
            D.requires_grad_(True)
            for _ in range(critic):
                real = torch.randn(128, 2, generator=gen) * scale + shift
                fake = G(torch.randn(128, 8, generator=gen))
                D.zero_grad()
                err_d = (F.binary_cross_entropy_with_logits(D(real), ones)
                         + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros))
                err_d.backward()
                opt_d.step()
                if log:
                    mons[0].log(loss=err_d)
                values[0].append(float(err_d.detach()))
            if freeze:
                D.requires_grad_(False)
            G.zero_grad()
            err_g = F.binary_cross_entropy_with_logits(D(fake), ones)
            err_g.backward()
            opt_g.step()
            if log:
                mons[1].log(loss=err_g)
            values[1].append(float(err_g.detach()))
    finally:
        for mon in mons:
            mon.close()
    return sender, values, mons


def _watched(*pairs: tuple[nn.Module, torch.optim.Optimizer]) -> tuple[CaptureSender, list[Any]]:
    """Monitors of (model, optimizer) pairs, the loss captured at ``backward()``, reporting
    to one engine: several ``watch()`` calls before any report."""
    sender = CaptureSender()
    return sender, [make_monitor(model, opt, sender, capture_loss=True)[0] for model, opt in pairs]


def _stream(sender: CaptureSender, k: int) -> list[dict[str, Any]]:
    return [f for f in sender.steps() if f.get("opt") == str(k)]


def _named(frames: list[dict[str, Any]]) -> list[tuple[str, float]]:
    return [next((k, v) for k, v in f["scalars"].items() if k in ("loss", "objective")) for f in frames]


@pytest.mark.parametrize("log", [False, True], ids=["captured", "logged"])
def test_a_gans_two_losses_are_objectives(log: bool) -> None:
    """The generator's second step shows the game (its loss reached the discriminator's
    gradients again after the discriminator's own step): the first round went out as
    losses, whose series the engine drops when the objectives arrive."""
    sender, values, mons = _gan(6, log)
    want = {0: [("loss", v) for v in values[0][:2]] + [("objective", v) for v in values[0][2:]],
            1: [("loss", values[1][0])] + [("objective", v) for v in values[1][1:]]}
    for k in (0, 1):
        frames = _stream(sender, k)
        assert [f["step"] for f in frames] == [1, 2, 3, 4, 5, 6]
        assert [n for n, _ in _named(frames)] == [n for n, _ in want[k]], f"optimizer {k}"
        assert [v for _, v in _named(frames)] == pytest.approx([v for _, v in want[k]]), f"optimizer {k}"
    assert not sender.engine.store.labelsets("sentinel_loss")
    assert len(sender.engine.store.labelsets("sentinel_scalar")) == 2
    assert all(m._player.adversarial for m in mons)


def test_a_gan_that_freezes_the_other_player_is_one_by_its_second_round() -> None:
    """The original WGAN's loop: the critic's ``requires_grad`` off for the generator's step
    (its ``backward()`` changes no gradient of the critic's), five critic steps a round."""
    sender, values, mons = _gan(4, freeze=True, critic=5)
    critic, gen = _named(_stream(sender, 0)), _named(_stream(sender, 1))
    assert [n for n, _ in critic] == ["loss"] * 10 + ["objective"] * 10
    assert [n for n, _ in gen] == ["loss", "objective", "objective", "objective"]
    assert [v for _, v in critic] == pytest.approx(values[0])
    assert not sender.engine.store.labelsets("sentinel_loss")
    assert all(m._player.adversarial for m in mons)


def test_a_healthy_gan_pages_no_loss_rule_and_did_before() -> None:
    """The generator's loss starts at log 2 and climbs as the discriminator learns: with
    the game not told apart (``game=False``), EarlyLossRising, critical, fires on it."""
    sender, values, _ = _gan(120, game=False)
    assert values[1][80] > 1.2 * values[1][0]  # the generator's loss did rise: what the rules read
    fired = {a["alertname"] for a in sender.engine.alerts_json()}
    assert "EarlyLossRising" in fired
    sender, _, _ = _gan(120)
    assert not {a["alertname"] for a in sender.engine.alerts_json()} & {
        "EarlyLossRising", "LossRising", "LossDivergence", "LossOscillation", "LossSpike"}


def test_optimizers_that_share_one_backward_are_no_game() -> None:
    """The PyTorch seq2seq tutorial's shape: an encoder's and a decoder's optimizer, one
    loss, both stepped after its ``backward()``; each stream keeps its loss."""
    torch.manual_seed(0)
    enc, dec = nn.Linear(4, 8), nn.Linear(8, 1)
    opt_e, opt_d = torch.optim.SGD(enc.parameters(), 0.1), torch.optim.SGD(dec.parameters(), 0.1)
    sender, mons = _watched((enc, opt_e), (dec, opt_d))
    values = []
    try:
        for _ in range(4):
            x = torch.randn(16, 4)
            loss = F.mse_loss(dec(enc(x)), x.sum(1, keepdim=True))
            opt_e.zero_grad()
            opt_d.zero_grad()
            loss.backward()
            opt_e.step()
            opt_d.step()
            values.append(float(loss.detach()))
    finally:
        for mon in mons:
            mon.close()
    for k in (0, 1):
        assert [f["scalars"].get("loss") for f in _stream(sender, k)] == pytest.approx(values), f"optimizer {k}"
    assert not any(m._player.adversarial for m in mons)


def test_optimizers_over_a_shared_trunk_each_on_its_own_loss_are_no_game() -> None:
    """A multi-task script's shape: an optimizer per task over the shared trunk and the
    task's head, stepped in turn, each on its task's loss. Each one's loss changes the
    trunk's gradients, which the other steps, round after round, as a game's would; but both
    lower their own loss on the trunk they share. Each stream keeps its loss."""
    torch.manual_seed(0)
    trunk, head_a, head_b = nn.Linear(4, 8), nn.Linear(8, 1), nn.Linear(8, 3)
    opt_a = torch.optim.Adam([*trunk.parameters(), *head_a.parameters()], 1e-2)
    opt_b = torch.optim.Adam([*trunk.parameters(), *head_b.parameters()], 1e-2)
    sender, mons = _watched((nn.Sequential(trunk, head_a), opt_a), (nn.Sequential(trunk, head_b), opt_b))
    values: list[list[float]] = [[], []]
    try:
        for _ in range(5):
            x = torch.randn(16, 4)
            for k, (opt, loss) in enumerate(((opt_a, lambda: F.mse_loss(head_a(trunk(x)), x.sum(1, keepdim=True))),
                                            (opt_b, lambda: F.cross_entropy(head_b(trunk(x)), (x[:, 0] > 0).long())))):
                opt.zero_grad()
                value = loss()
                value.backward()
                opt.step()
                values[k].append(float(value.detach()))
    finally:
        for mon in mons:
            mon.close()
    for k in (0, 1):
        assert [f["scalars"].get("loss") for f in _stream(sender, k)] == pytest.approx(values[k]), f"optimizer {k}"
    assert not any(m._player.adversarial for m in mons)


def test_a_frozen_backbone_then_its_own_optimizer_is_no_game() -> None:
    """A fine-tuning script's stages: a head trained by its own Adam while the backbone is
    frozen, then the backbone unfrozen and trained by its own SGD, head and all, each
    stage on a loss of its own: the backbone was frozen at the head's steps, but never
    again after its own."""
    torch.manual_seed(0)
    backbone, head = nn.Linear(4, 8), nn.Linear(8, 1)
    opt_h, opt_b = torch.optim.Adam(head.parameters(), 1e-2), torch.optim.SGD(backbone.parameters(), 1e-2)
    sender, mons = _watched((head, opt_h), (backbone, opt_b))
    try:
        for stage, opt in ((0, opt_h), (1, opt_b)):
            backbone.requires_grad_(stage == 1)
            for _ in range(4):
                x = torch.randn(16, 4)
                opt.zero_grad()
                F.mse_loss(head(backbone(x)), x.sum(1, keepdim=True)).backward()
                opt.step()
    finally:
        for mon in mons:
            mon.close()
    assert all("loss" in f["scalars"] for f in sender.steps())
    assert not any(m._player.adversarial for m in mons)


def test_said_otherwise_and_a_closed_game_leaves_no_player_behind() -> None:
    """``game=True`` makes any stream's loss an objective; a GAN whose monitors closed
    makes no game of the next training in the process (a supervised model's two
    optimizers, one per part, each with a loss of its own)."""
    sender, values, _ = _gan(3, game=True)
    assert all("objective" in f["scalars"] for f in sender.steps())
    _gan(3)  # a game, closed
    torch.manual_seed(0)
    a, b = nn.Linear(4, 1), nn.Linear(4, 1)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), 0.1), torch.optim.SGD(b.parameters(), 0.1)
    sender, mons = _watched((a, opt_a), (b, opt_b))
    try:
        for _ in range(3):
            for model, opt in ((a, opt_a), (b, opt_b)):
                x = torch.randn(8, 4)
                opt.zero_grad()
                F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
                opt.step()
    finally:
        for mon in mons:
            mon.close()
    assert all("loss" in f["scalars"] and "objective" not in f["scalars"] for f in sender.steps())


@pytest.mark.parametrize("value", ["2", "maybe"])
def test_a_bad_sentinel_game_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from sentinel.instrument.options import from_kwargs

    monkeypatch.setenv("SENTINEL_GAME", value)
    with pytest.raises(ValueError, match="game: must be 1, 0 or auto"):
        from_kwargs({})
    monkeypatch.setenv("SENTINEL_GAME", "0")
    assert from_kwargs({}).game is False


def test_sentinel_game_1_as_the_readme_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SENTINEL_GAME=1`` in the environment (as under ``sentinel run``): every stream's
    loss is an objective from the first step, a lone optimizer's too."""
    monkeypatch.setenv("SENTINEL_GAME", "1")
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    mon, sender = make_monitor(model, opt, capture_loss=True)
    try:
        for _ in range(3):
            x = torch.randn(8, 4)
            opt.zero_grad()
            F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
            opt.step()
    finally:
        mon.close()
    assert [sorted(f["scalars"]) for f in sender.steps()] == [["objective"]] * 3
    assert not sender.engine.store.labelsets("sentinel_loss")
