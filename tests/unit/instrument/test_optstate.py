"""The six optimizers measured for what they are: state bytes by key, each health figure
and LAMB's trust ratio, against references computed by hand with torch on real optimizers
(torch's SGD, Adam, AdamW, Adafactor; pytorch-optimizer's AdaFactor, Lamb, Lion, SophiaH)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from sentinel.instrument import optstate, probes
from sentinel.instrument.stats import adam_saturation
from tests.helpers import make_monitor

po = pytest.importorskip("pytorch_optimizer")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 1))


def _train(opt: torch.optim.Optimizer, model: nn.Module, steps: int = 3) -> None:
    graph = type(opt).__name__.startswith("Sophia")
    for _ in range(steps):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward(create_graph=graph)
        opt.step()


def _ref_bytes(opt: torch.optim.Optimizer) -> dict[str, int]:
    out: dict[str, int] = {}
    for st in opt.state.values():
        for k, v in st.items():
            if k != "step" and torch.is_tensor(v):
                out[k] = out.get(k, 0) + v.numel() * v.element_size()
    return out


MAKERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3),
    "adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-2),
    "po-adafactor": lambda p: po.AdaFactor(p, lr=1e-2),
    "lamb": lambda p: po.Lamb(p, lr=1e-3),
    "lion": lambda p: po.Lion(p, lr=1e-4),
    "sophia": lambda p: po.SophiaH(p, lr=1e-3),
}
EXPECTED_KEYS = {
    "sgd": {"momentum_buffer": 4 * (8 * 6 + 6 + 6 + 1)},
    "adam": {"exp_avg": 4 * 61, "exp_avg_sq": 4 * 61},
    "adamw": {"exp_avg": 4 * 61, "exp_avg_sq": 4 * 61},
    # factored: a (6, 8) weight keeps 6 + 8 floats, a (1, 6) one 1 + 6; biases a full variance
    "adafactor": {"row_var": 4 * (6 + 1), "col_var": 4 * (8 + 6), "variance": 4 * (6 + 1)},
}


@pytest.mark.parametrize("name", list(MAKERS))
def test_state_bytes_by_key_without_the_step_counter(name: str) -> None:
    model = _model()
    opt = MAKERS[name](model.parameters())
    _train(opt, model)
    got = probes.state_bytes([opt])
    assert "step" not in got
    assert got == _ref_bytes(opt)
    if name in EXPECTED_KEYS:
        assert got == EXPECTED_KEYS[name]
    if name == "lamb":  # the one-element trust_ratio etc. at their real size
        assert got["trust_ratio"] == 4 * 4 and got["exp_avg"] == 4 * 61


def _figures(opt: torch.optim.Optimizer, threshold: float) -> dict[str, float]:
    nums, totals, _ = optstate.health([opt], threshold, 64, 0)
    return {k: float(sum(v.sum() for v in nums[k].values())) / totals[k] for k in nums}


@pytest.mark.parametrize("name", ["adafactor", "po-adafactor"])
def test_adafactor_saturation_is_the_rebuilt_second_moment_above_the_threshold(name: str) -> None:
    model = _model()
    opt = MAKERS[name](model.parameters())
    _train(opt, model)
    above = total = 0
    for st in opt.state.values():  # every tensor is small: the grid and the stride take all of it
        r = st.get("row_var", st.get("exp_avg_sq_row"))
        c = st.get("col_var", st.get("exp_avg_sq_col"))
        v = torch.outer(r.reshape(-1), c.reshape(-1)) / r.mean() if r is not None else st.get(
            "variance", st.get("exp_avg_sq"))
        above += int((v > 1e-4).sum())
        total += v.numel()
    figs = _figures(opt, 1e-4)
    assert figs["adafactor_saturation"] == pytest.approx(above / total)
    assert optstate.adam_like([opt]) == []  # Adam's figure would read the biases alone


def test_lion_sign_agreement() -> None:
    model = _model()
    opt = MAKERS["lion"](model.parameters())
    _train(opt, model)
    agree = total = 0
    for p in model.parameters():
        m = opt.state[p]["exp_avg"]
        agree += int((torch.sign(m) == torch.sign(p.grad)).logical_and(p.grad != 0).sum())
        total += m.numel()
    assert _figures(opt, 1e-3)["lion_sign_agreement"] == pytest.approx(agree / total)


def test_sophia_clip_fraction_and_hessian_scale() -> None:
    model = _model()
    opt = MAKERS["sophia"](model.parameters())
    _train(opt, model, 6)
    clipped = total = 0
    hsum = 0.0
    rho, eps = opt.param_groups[0]["p"], opt.param_groups[0]["eps"]
    for p in model.parameters():
        st = opt.state[p]
        clipped += int((st["momentum"].abs() >= rho * st["hessian_moment"].clamp_min(eps)).sum())
        hsum += float(st["hessian_moment"].sum())
        total += p.numel()
    figs = _figures(opt, 1e-3)
    assert figs["sophia_clip_fraction"] == pytest.approx(clipped / total)
    assert figs["sophia_hessian_mean"] == pytest.approx(hsum / total, rel=1e-5)


def test_adam_saturation_still_reads_adam() -> None:
    model = _model()
    opt = MAKERS["adamw"](model.parameters())
    _train(opt, model)
    assert optstate.adam_like([opt]) == [opt]
    assert optstate.health([opt], 1e-3, 64, 0)[1] == {}  # no figure of its own besides SS
    counts, total, _ = adam_saturation([opt], 1e-8, 64, 0)
    ref = sum(int((st["exp_avg_sq"] > 1e-8).sum()) for st in opt.state.values())
    assert total == 61 and float(sum(c.sum() for c in counts.values())) == ref


def test_lamb_trust_ratio_per_group_in_the_frame_and_the_engine() -> None:
    model = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 1))
    opt = po.Lamb(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt, state_every=1)
    _train(opt, model)
    mon.close()
    frame = sender.steps()[-1]
    ref: dict[str, list[float]] = {}
    for name, p in model.named_parameters():
        ref.setdefault(name.split(".")[0], []).append(float(opt.state[p]["trust_ratio"]))
    want = {g: sum(v) / len(v) for g, v in ref.items()}
    assert dict(zip(frame["groups"], frame["trust_ratio"])) == pytest.approx(want)
    base = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    store = sender.engine.store
    for g, v in want.items():
        last = store.last("sentinel_group_trust_ratio", tuple(sorted(base + (("group", g),))))
        assert last is not None and last[2] == pytest.approx(v)
    # and the frames of a Lion run carry its figure to the exporter
    lion = po.Lion(model.parameters(), lr=1e-4)
    mon, sender = make_monitor(model, lion, state_every=1)
    _train(lion, model)
    mon.close()
    labels = tuple(sorted((("job", "train"), ("rank", "0"), ("run", mon.options.run),
                           ("figure", "lion_sign_agreement"))))
    last = sender.engine.store.last("sentinel_optimizer_health_ratio", labels)
    assert last is not None and 0.0 <= last[2] <= 1.0


class _Blocked(torch.optim.Optimizer):
    """SGD that keeps a buffer per block of each parameter under keys of its own making (as
    blocked preconditioners do): ``block_0`` ... ``block_79``, one key of 80 characters and
    one that is no string."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, {"lr": 0.01})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                for i in range(80):
                    st.setdefault(f"block_{i}", torch.zeros(2))
                st.setdefault("a_very_long_state_key_" + "x" * 58, torch.zeros(3))
                st.setdefault(7, torch.zeros(5))
                p.add_(p.grad, alpha=-group["lr"])


def test_a_state_of_many_keys_is_bounded_to_what_a_frame_carries() -> None:
    """82 state keys, one of 80 characters and one an int: the frame carries 63 of them by
    name and the rest summed as ``other``, every byte counted, and the engine takes it. The
    engine dropped the whole ``state_bytes`` of every frame (more than 64 keys), so the run
    had no optimizer state figure; the int key failed the frame's encoding."""
    from sentinel import wire

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = _Blocked(model.parameters())
    mon, sender = make_monitor(model, opt, state_every=1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(3, 4)).pow(2).mean().backward()
        opt.step()
    mon.close()
    st = sender.steps()[-1]["state_bytes"]
    assert len(st) == wire.MAX_STATE_KEYS and all(isinstance(k, str) and 0 < len(k) <= 64 for k in st)
    assert sum(st.values()) == 2 * (80 * 2 + 3 + 5) * 4  # two parameters, float32
    assert st["block_0"] == 2 * 2 * 4 and "other" in st
    assert sender.engine.fields_dropped == {} and sender.engine.frames_malformed == 0
