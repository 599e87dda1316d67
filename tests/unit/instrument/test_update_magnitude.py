"""‖Δw‖ and the seed's UAR (mean|Δw| / mean|w|) equal references computed with torch."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import MLP, make_monitor, train_steps


def _group(name: str) -> str:
    return name.rsplit(".", 2)[0] if name.startswith("layers") else "head"


@pytest.mark.parametrize("budget", [2**30, 1])  # every group each step; one group at a time
def test_update_norm_and_mean_abs_ratio_match_torch(mlp: MLP, budget: int) -> None:
    opt = torch.optim.AdamW(mlp.parameters(), lr=1e-2)
    old: dict[str, torch.Tensor] = {}
    manual: list[dict[str, tuple[float, float, float]]] = []

    def before(_: int) -> None:
        old.clear()
        old.update({n: p.detach().clone() for n, p in mlp.named_parameters()})

    def after(*_: object) -> None:
        ref: dict[str, tuple[float, float, float]] = {}
        for n, p in mlp.named_parameters():
            d = (p.detach() - old[n]).double()
            sq, l1, w1 = ref.get(_group(n), (0.0, 0.0, 0.0))
            ref[_group(n)] = (sq + float(d.pow(2).sum()), l1 + float(d.abs().sum()),
                              w1 + float(old[n].double().abs().sum()))
        manual.append(ref)

    opt.register_step_post_hook(after)
    mon, sender = make_monitor(mlp, opt, update_every=1, update_snapshot_bytes=budget)
    train_steps(mlp, opt, 6, mon, before_step=before)
    mon.close()
    store = sender.engine.store
    base = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    norms = store.window("sentinel_update_norm", base)
    uars = store.window("sentinel_update_mean_abs_ratio", base)
    assert norms is not None and uars is not None and len(norms) == len(uars) == 6
    for i, (frame, ref) in enumerate(zip(sender.steps(), manual)):
        sampled = [g for g, d in zip(frame["groups"], frame["delta_sumsq"]) if d is not None]
        assert sampled
        want_norm = math.sqrt(sum(ref[g][0] for g in sampled))
        # mean|Δw| / mean|w| over the sampled elements: the counts cancel
        want_uar = sum(ref[g][1] for g in sampled) / sum(ref[g][2] for g in sampled)
        assert norms.values[i] == pytest.approx(want_norm, rel=1e-4)
        assert uars.values[i] == pytest.approx(want_uar, rel=1e-4)
        for g in sampled:
            labels = tuple(sorted(base + (("group", g),)))
            gw = store.window("sentinel_group_update_mean_abs_ratio", labels)
            assert gw is not None
        if budget == 1:
            assert len(sampled) == 1
    last = manual[-1]
    for g in frame["groups"]:
        labels = tuple(sorted(base + (("group", g),)))
        if budget == 2**30:
            gn = store.last("sentinel_group_update_norm", labels)
            assert gn is not None and gn[2] == pytest.approx(math.sqrt(last[g][0]), rel=1e-4)
            gu = store.last("sentinel_group_update_mean_abs_ratio", labels)
            assert gu is not None and gu[2] == pytest.approx(last[g][1] / last[g][2], rel=1e-4)


def test_the_first_steps_sample_every_step(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt, update_every=10, early_steps=5)
    train_steps(mlp, opt, 12, mon)
    mon.close()
    sampled = [f["step"] for f in sender.steps() if "delta_sumsq" in f]
    assert sampled == [1, 2, 3, 4, 5, 10]


@pytest.mark.parametrize(("max_iter", "sampled"), [(20, False), (1, True)])
def test_an_lbfgs_step_of_several_iterations_has_no_update_size(mlp: MLP, max_iter: int, sampled: bool) -> None:
    """LBFGS's step runs up to ``max_iter`` iterations: its change of the weights is many
    updates', which the update-size rules (a tenth of the weights per update is too much)
    would misjudge (neural style transfer's first step moves the image by a fifth:
    tests/programs/neural_style.py). Its steps carry no update figures; an LBFGS of one
    iteration a step keeps them. The gradients and parameter norms are read either way."""
    opt = torch.optim.LBFGS(mlp.parameters(), lr=0.5, max_iter=max_iter)
    mon, sender = make_monitor(mlp, opt, update_every=1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(8, 16, generator=gen)

        def closure(x: torch.Tensor = x) -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(mlp(x), x.sum(dim=1, keepdim=True))
            loss.backward()
            return loss

        mon.log(loss=opt.step(closure))
    mon.close()
    frames = sender.steps()
    assert [f["step"] for f in frames] == [1, 2, 3]
    assert all(any(v is not None for v in f["delta_sumsq"]) for f in frames) if sampled else \
        not any("delta_sumsq" in f for f in frames)
    assert all(f["grad_sumsq"] and f["param_sumsq"] for f in frames)
    base = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    assert (sender.engine.store.window("sentinel_update_mean_abs_ratio", base) is not None) == sampled
