"""The pre-clip gradient norm: what ``clip_grad_norm_`` returned reaches the frame and the
store, in explicit and zero-code mode, and clipping a monitored run changes nothing."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

import pytest
import torch
from torch import nn

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.instrument import preclip as clip
from sentinel.store import labels_of
from tests.helpers import MLP, make_monitor

MAX_NORM = 0.5


def _train(steps: int, clip_fn: Any, mon: Any = None) -> tuple[nn.Module, list[float]]:
    """SGD on a fixed regression task, clipping every step; returns the model and the norms
    that ``clip_fn`` returned."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if mon is not None:
        mon = mon(model, opt)
    gen = torch.Generator().manual_seed(1)
    norms = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen)
        loss = nn.functional.mse_loss(model(x), 3 * x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        norms.append(float(clip_fn(model.parameters(), MAX_NORM)))
        opt.step()
        if mon is not None:
            mon[0].log(loss=loss)
    if mon is not None:
        mon[0].close()
    return model, norms


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("how", ["module attribute", "name bound before watch", "clip_grads_with_norm_"])
def test_explicit_mode_reports_the_preclip_norm(how: str) -> None:
    from torch.nn.utils import clip_grad_norm_ as bound_early  # bound before the monitor exists

    def get_then_clip(params: Any, max_norm: float) -> torch.Tensor:
        params = list(params)
        total = torch.nn.utils.get_total_norm([p.grad for p in params])
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    fn = {"module attribute": lambda ps, m: torch.nn.utils.clip_grad_norm_(ps, m),
          "name bound before watch": bound_early,
          "clip_grads_with_norm_": get_then_clip}[how]
    reference, ref_norms = _train(12, fn)
    model, norms = _train(12, fn, mon=make_monitor)
    assert _same_weights(model, reference)  # clipping still clips; monitoring changes nothing
    assert norms == ref_norms
    assert max(norms) > MAX_NORM  # the test means something: clipping did clip


def test_frames_and_store_carry_the_preclip_norm() -> None:
    holder: dict[str, Any] = {}

    def watch(model: nn.Module, opt: torch.optim.Optimizer) -> Any:
        holder["mon"], holder["sender"] = make_monitor(model, opt)
        return holder["mon"], holder["sender"]

    _, norms = _train(12, torch.nn.utils.clip_grad_norm_, mon=watch)
    steps = holder["sender"].steps()
    assert [f["clip_norm"] for f in steps] == pytest.approx(norms, rel=1e-6)
    assert all(f["clip_max"] == MAX_NORM for f in steps)
    # the step hooks see clipped grads: sentinel_grad_norm is the post-clip norm
    post = [math.sqrt(sum(f["grad_sumsq"])) for f in steps]
    assert post == pytest.approx([min(n, MAX_NORM) for n in norms], rel=1e-4)
    store = holder["sender"].engine.store
    base = labels_of(job=steps[0]["job"], run=steps[0]["run"], rank=0)
    window = store.window("sentinel_grad_norm_preclip", base)
    assert window is not None and window.values.tolist() == pytest.approx(norms, rel=1e-6)
    clipped = sum(n > MAX_NORM for n in norms)
    assert 0 < clipped and store.counter("sentinel_grad_clipped_steps_total", base) == clipped
    assert store.last("sentinel_grad_clip_max_norm", base)[2] == MAX_NORM  # type: ignore[index]


def test_no_clip_no_field_and_close_restores_torch() -> None:
    from torch.nn.utils import clip_grad

    before = clip_grad._clip_grads_with_norm_
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon, sender = make_monitor(model, opt)
    assert clip_grad._clip_grads_with_norm_ is not before  # wrapped while the monitor is open
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    mon.close()
    assert clip_grad._clip_grads_with_norm_ is before
    assert all("clip_norm" not in f and "clip_max" not in f for f in sender.frames)


def test_a_gans_clipping_is_the_clipped_players_own() -> None:
    """The discriminator clips its gradients and the generator does not (many GAN scripts
    clip the critic alone): the generator's stream carried the discriminator's norm at 199 of
    200 steps, as if its own gradients had been clipped."""
    torch.manual_seed(0)
    net_g, net_d = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)), nn.Sequential(nn.Linear(2, 1))
    opt_g = torch.optim.Adam(net_g.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(net_d.parameters(), lr=1e-3)
    mon_d, sender = make_monitor(net_d, opt_d)
    mon_g, _ = make_monitor(net_g, opt_g, sender)
    norms = []
    for _ in range(8):
        opt_d.zero_grad()
        (net_d(net_g(torch.randn(16, 8)).detach()).mean() - net_d(torch.randn(16, 2)).mean()).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net_d.parameters(), 1e-3)))
        opt_d.step()
        opt_g.zero_grad()
        net_d(net_g(torch.randn(16, 8))).mean().neg().backward()
        opt_g.step()
    mon_d.close()
    mon_g.close()
    by_stream: dict[str, list[Any]] = {}
    for f in sender.steps():
        by_stream.setdefault(f["opt"], []).append(f.get("clip_norm"))
    assert by_stream["0"] == pytest.approx(norms, rel=1e-6)  # the discriminator's, its own
    assert by_stream["1"] == [None] * 8  # the generator clips nothing


def test_a_failing_listener_never_reaches_training() -> None:
    def bad(total: torch.Tensor, max_norm: float, params: Any) -> None:
        raise RuntimeError("boom")

    handle = clip.attach(bad)
    try:
        model = MLP()
        model(torch.randn(4, 16)).sum().backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        after = math.sqrt(math.fsum(float(g.square().sum()) for g in grads))
        assert after == pytest.approx(1e-3, rel=1e-3) and float(total) > 1e-3
    finally:
        handle.remove()


def test_engine_drops_bad_clip_fields_and_keeps_the_rest() -> None:
    engine = Engine()
    frame = {"kind": "step", "job": "j", "run": "r", "rank": 0, "step": 1, "t": 1.0, "groups": ["a"],
             "grad_sumsq": [1.0], "clip_norm": "x", "clip_max": None}
    assert engine.feed(wire.encode(frame))
    base = labels_of(job="j", run="r", rank=0)
    assert engine.store.last("sentinel_grad_norm_preclip", base) is None
    assert engine.store.last("sentinel_grad_norm", base)[2] == 1.0  # type: ignore[index]
    assert engine.refused == {} and engine.fields_dropped == {("clip_norm", "schema"): 1,
                                                              ("clip_max", "schema"): 1}


_ZERO_CODE = r"""
import json, sys
import torch
from torch import nn
from torch.nn.utils import clip_grad_norm_
from sentinel.instrument import auto
from sentinel.instrument import monitor
from sentinel import wire

frames = []

class Capture:
    dropped = 0
    def send(self, data):
        frames.append(wire.decode(data))
        return True
    def close(self):
        pass

monitor.connect = lambda options: (Capture(), None, None)  # frames stay here
assert auto.install()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(1)
norms = []
for _ in range(12):
    x = torch.randn(8, 16, generator=gen)
    loss = nn.functional.mse_loss(model(x), 3 * x.sum(dim=1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    norms.append(float(clip_grad_norm_(model.parameters(), float(sys.argv[1]))))
    opt.step()
auto.close_all()
print(json.dumps({"norms": norms, "frames": [f for f in frames if f["kind"] == "step"],
                  "weights": [p.detach().reshape(-1).tolist() for p in model.parameters()]}))
"""


def test_zero_code_mode_reports_the_preclip_norm() -> None:
    env = {**os.environ, "SENTINEL_AUTO": "1"}
    out = subprocess.run([sys.executable, "-c", _ZERO_CODE, str(MAX_NORM)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    frames, norms = got["frames"], got["norms"]
    assert len(frames) == 12 and max(norms) > MAX_NORM
    # the first step's clip came before the monitor attached, and is still reported
    assert [f["clip_norm"] for f in frames] == pytest.approx(norms, rel=1e-6)
    assert all(f["clip_max"] == MAX_NORM for f in frames)
    # the same loop, unmonitored, in this process: identical weights
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    for _ in range(12):
        x = torch.randn(8, 16, generator=gen)
        loss = nn.functional.mse_loss(model(x), 3 * x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
    assert [p.detach().reshape(-1).tolist() for p in model.parameters()] == got["weights"]


def test_gradient_spike_fires_on_the_norm_before_clipping() -> None:
    """A clipped run's grad norm never exceeds max_norm, so the spike rules read the
    pre-clip norm when the frames carry one (the pack's metric list prefers it)."""
    import math
    import random

    from sentinel import wire
    from sentinel.engine.engine import Engine

    engine, rng = Engine(clock=lambda: 0.0), random.Random(0)
    for step in range(80):
        pre = 100.0 if step == 70 else 2.0 * math.exp(0.1 * rng.gauss(0, 1))
        engine.feed(wire.encode({"kind": "step", "job": "j", "run": "clip", "rank": 0, "step": step, "t": float(step),
                                 "groups": ["a"], "grad_sumsq": [1.0], "clip_norm": pre, "clip_max": 1.0,
                                 "scalars": {"loss": 1.0 + 0.01 * rng.gauss(0, 1)}}))
    spike = [t for t in engine.transitions if t.alertname == "GradientSpike" and t.state_to == "firing"]
    assert len(spike) == 1 and spike[0].step == 70 and spike[0].value == 100.0
