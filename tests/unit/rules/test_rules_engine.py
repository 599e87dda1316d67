"""The rule engine with the full default pack on simulated runs written into a real Store.

A clean run (noisy loss, lr decay, normal AMP overflows, Adam's state allocation jump)
must stay silent; each injected fault must fire its rule — once, grouped across ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sentinel.rules import RuleEngine, Transition, load_pack
from sentinel.rules.ingested import Ingested
from sentinel.store import Store, labels_of

GROUPS = [f"layers.{i}" for i in range(8)]
CAPACITY = 10e9
Fault = Callable[[int, int, dict[str, Any]], None]


class Sim:
    """Writes what the engine would write for each rank's step frame, then evaluates."""

    def __init__(self, ranks: int = 2, user: dict[str, Any] | None = None, seed: int = 0) -> None:
        self.ranks = ranks
        self.store = Store(capacity=512)
        self.t = 1000.0
        self.engine = RuleEngine(load_pack(user), self.store, clock=lambda: self.t)
        self.rng = np.random.default_rng(seed)
        self.grad_hist: dict[int, list[float]] = {r: [] for r in range(ranks)}
        self.scale = {r: 65536.0 for r in range(ranks)}
        self.lr_change: int | None = None
        self.lr = 1e-3
        self.out: list[Transition] = []

    def values(self, step: int, rank: int) -> dict[str, Any]:
        n = self.rng.standard_normal
        decayed = self.lr < 1e-3
        loss = (0.5 + 1.5 * math.exp(-step / 400)) * (0.6 if decayed else 1.0) * (1 + 0.08 * n())
        grad = math.exp(0.2 * n())
        if step < 5:
            self.scale[rank] = 65536.0 / 2 ** (step + 1)  # GradScaler calibrating
        return {
            "sentinel_loss": loss,
            "sentinel_grad_norm": grad,
            "sentinel_group_grad_norm": {g: grad / 3 * math.exp(0.1 * n()) for g in GROUPS},
            "sentinel_param_norm": 100.0,
            "sentinel_update_ratio": (3e-3 * (0.1 if decayed else 1.0) * math.exp(0.1 * n()))
            if step % 10 == 0
            else None,
            "sentinel_learning_rate": self.lr,
            "sentinel_optimizer_state_saturation_ratio": 0.05,
            "sentinel_memory_used_bytes": (3e9 if step == 0 else 6e9) + 1e6 * n(),
            "sentinel_memory_capacity_bytes": CAPACITY,
            "sentinel_amp_loss_scale": self.scale[rank],
            "nonfinite": {"loss": 0.0, "grad": 0.0, "param": 0.0},
            "nonfinite_groups": {},
            "amp_skip": False,
        }

    def write(self, step: int, rank: int, v: dict[str, Any]) -> None:
        s, L, t = self.store, labels_of(job="job", run="run", rank=rank), self.t
        h = self.grad_hist[rank]
        h.append(v["sentinel_grad_norm"])
        del h[:-50]
        if len(h) >= 10:
            gvr = float(np.var(h) / np.mean(h) ** 2)
            s.add("sentinel_gradient_variance_ratio", L, step, t, gvr)
        if v["amp_skip"]:
            s.inc("sentinel_amp_skipped_steps_total", L)
        for name, value in v.items():
            if name in ("nonfinite", "nonfinite_groups", "amp_skip") or value is None:
                continue
            if isinstance(value, dict):
                for g, x in value.items():
                    s.add(name, labels_of(job="job", run="run", rank=rank, group=g), step, t, x)
            else:
                s.add(name, L, step, t, value)
        for src, flag in v["nonfinite"].items():
            src_labels = labels_of(job="job", run="run", rank=rank, source=src)
            s.add("sentinel_nonfinite_detected", src_labels, step, t, flag)
        s.add("sentinel_step", L, step, t, float(step))
        s.add("sentinel_last_step_timestamp_seconds", L, step, t, t)

    def run(
        self, start: int, stop: int, fault: Fault | None = None, lr_decay_at: int | None = None
    ) -> list[Transition]:
        out: list[Transition] = []
        for step in range(start, stop):
            if step == lr_decay_at:
                self.lr, self.lr_change = 1e-4, step
            self.t += 0.5
            for rank in range(self.ranks):
                v = self.values(step, rank)
                if step == 700:  # a normal fp16 overflow: grads inf, step skipped, scale halved
                    v["nonfinite"]["grad"] = 1.0
                    v["amp_skip"] = True
                    self.scale[rank] /= 2
                    v["sentinel_amp_loss_scale"] = self.scale[rank]
                if fault is not None:
                    fault(step, rank, v)
                self.write(step, rank, v)
                ctx = Ingested(nonfinite_groups=v["nonfinite_groups"], lr_change_step=self.lr_change)
                out += self.engine.evaluate("job", "run", rank, step, self.t, ctx)
            if step % 2 == 0:
                out += self.engine.tick(self.t)
        self.out += out
        return out


def fired(out: list[Transition]) -> list[str]:
    return [t.alertname for t in out if t.state_to == "firing"]


def test_clean_run_is_silent() -> None:
    sim = Sim(ranks=2)
    out = sim.run(0, 1500, lr_decay_at=900)
    assert [(t.alertname, t.state_to, t.step, t.summary) for t in out] == []
    assert sim.engine.active() == [] and sim.engine.firing_series() == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clean_runs_with_other_seeds_are_silent(seed: int) -> None:
    assert Sim(ranks=1, seed=seed).run(0, 1200, lr_decay_at=600) == []


def _nan_everywhere(step: int, rank: int, v: dict[str, Any]) -> None:
    if step >= 300:
        v["sentinel_loss"] = math.nan
        v["nonfinite"] = {"loss": 1.0, "grad": 1.0, "param": 1.0}
        v["nonfinite_groups"] = {"grad": ["layers.5", "layers.6"], "param": ["layers.5"]}


def test_nan_on_all_ranks_gives_one_grouped_critical_alert() -> None:
    sim = Sim(ranks=8)
    out = sim.run(0, 310, fault=_nan_everywhere)
    assert fired(out) == ["TrainingNonFinite"]
    [t] = out
    assert t.severity == "critical" and t.step == 300
    assert t.ranks == tuple(range(8)) and t.groups == ("layers.5", "layers.6")
    assert "ranks 0–7" in t.summary and "layers.5, layers.6" in t.summary
    [alert] = sim.engine.active()
    assert alert["state"] == "firing" and alert["ranks"] == list(range(8))
    labels = {"alertname": "TrainingNonFinite", "severity": "critical", "job": "job", "run": "run"}
    assert sim.engine.firing_series() == [(labels, 1.0)]


def test_normal_amp_overflow_does_not_fire_but_param_nan_does() -> None:
    def param_nan(step: int, rank: int, v: dict[str, Any]) -> None:
        if step == 400 and rank == 1:
            v["nonfinite"]["param"] = 1.0
            v["nonfinite_groups"] = {"param": ["layers.2"]}

    sim = Sim(ranks=2)
    out = sim.run(0, 720, fault=param_nan)  # includes the AMP skip at step 700
    assert fired(out) == ["TrainingNonFinite"]
    assert out[0].ranks == (1,) and out[0].groups == ("layers.2",) and out[0].step == 400


def test_gradient_spike_fires_then_resolves() -> None:
    def spike(step: int, rank: int, v: dict[str, Any]) -> None:
        if step == 400:
            v["sentinel_grad_norm"] = 50.0

    # the spike raises GVR suddenly too, which GradientNoiseRising reports (seed 000 §4.4:
    # save the batch); this test follows GradientSpike's life cycle alone
    sim = Sim(ranks=2, user={"rules": {"GradientNoiseRising": {"enabled": False}}})
    out = sim.run(0, 420, fault=spike)
    assert [(t.alertname, t.state_to) for t in out] == [
        ("GradientSpike", "firing"),
        ("GradientSpike", "resolved"),
    ]
    assert out[0].ranks == (0, 1) and out[0].step == 400 and out[0].value == 50.0
    assert sim.engine.recent()[0]["alertname"] == "GradientSpike"


def test_oscillating_loss_fires_oscillation() -> None:
    def zigzag(step: int, rank: int, v: dict[str, Any]) -> None:
        if step >= 300:
            v["sentinel_loss"] *= 1.5 if step % 2 else 0.5

    out = Sim(ranks=1).run(0, 450, fault=zigzag)
    assert "LossOscillation" in fired(out)


def test_diverging_loss_fires_divergence() -> None:
    def climb(step: int, rank: int, v: dict[str, Any]) -> None:
        if step >= 300:
            v["sentinel_loss"] *= 1.01 ** (step - 300)

    out = Sim(ranks=1).run(0, 450, fault=climb)
    assert "LossDivergence" in fired(out)
    assert "LossOscillation" not in fired(out)


def test_memory_leak_fires_oom_risk() -> None:
    def leak(step: int, rank: int, v: dict[str, Any]) -> None:
        v["sentinel_memory_used_bytes"] = 6e9 + 5e6 * step  # ~10 MB/s at 0.5 s/step

    out = Sim(ranks=1).run(0, 300, fault=leak)
    # first the warning; by step 300 the capacity is ~4 minutes away: critical too
    assert fired(out) == ["OOMRisk", "MemoryCritical"]
    assert "full in ~" in out[0].summary


def test_vanishing_gradient_names_the_group() -> None:
    def vanish(step: int, rank: int, v: dict[str, Any]) -> None:
        v["sentinel_group_grad_norm"]["layers.3"] = 1e-9

    out = Sim(ranks=2).run(0, 200, fault=vanish)
    assert fired(out) == ["GradientVanishing"]
    assert out[0].groups == ("layers.3",) and out[0].ranks == (0, 1)


def test_frozen_groups_are_not_vanishing() -> None:
    def frozen(step: int, rank: int, v: dict[str, Any]) -> None:
        v["sentinel_group_grad_norm"]["layers.0"] = 0.0

    assert Sim(ranks=1).run(0, 300, fault=frozen) == []


def test_tiny_updates_fire_update_ratio_low() -> None:
    def tiny(step: int, rank: int, v: dict[str, Any]) -> None:
        if v["sentinel_update_ratio"] is not None:
            v["sentinel_update_ratio"] = 1e-6

    out = Sim(ranks=1).run(0, 300, fault=tiny)
    assert fired(out) == ["UpdateRatioLow"]


def test_loss_scale_collapse() -> None:
    def collapse(step: int, rank: int, v: dict[str, Any]) -> None:
        if step >= 300 and step % 5 == 0:
            v["amp_skip"] = True
            v["nonfinite"]["grad"] = 1.0
            sim.scale[rank] /= 2
            v["sentinel_amp_loss_scale"] = sim.scale[rank]

    sim = Sim(ranks=1)
    out = sim.run(0, 400, fault=collapse)
    assert fired(out) == ["LossScaleCollapse"]


def test_sparse_series_is_judged_off_its_rules_phase() -> None:
    # memory comes every 10 steps; OOMRisk runs every 5 steps on a phase that may never
    # land on a multiple of 10: it must still judge each sample
    def sparse(step: int, rank: int, v: dict[str, Any]) -> None:
        if step % 10:
            v["sentinel_memory_used_bytes"] = v["sentinel_memory_capacity_bytes"] = None
        elif step >= 200:
            v["sentinel_memory_used_bytes"] = 9.5e9

    out = Sim(ranks=1).run(0, 300, fault=sparse)
    # 95 % of capacity: the warning (80 %) and MemoryCritical (90 %) both judge each sample
    assert sorted(set(fired(out))) == ["MemoryCritical", "OOMRisk"]
    assert all(200 <= t.step <= 240 for t in out if t.state_to == "firing")


def test_new_samples_at_a_frozen_step_are_judged() -> None:
    # the AMP scaler skips every step: the step number stands still while log frames keep
    # bringing a halved loss scale (the rule runs every 5 steps, so it catches up every
    # 10 frames)
    sim = Sim(ranks=1)
    sim.run(0, 300)
    labels = labels_of(job="job", run="run", rank=0)
    out: list[Transition] = []
    for _ in range(20):
        sim.t += 0.5
        sim.scale[0] /= 2
        sim.store.add("sentinel_amp_loss_scale", labels, 299, sim.t, sim.scale[0])
        sim.store.inc("sentinel_amp_skipped_steps_total", labels)
        out += sim.engine.evaluate("job", "run", 0, 299, sim.t)
    assert fired(out) == ["LossScaleCollapse"]


@pytest.mark.parametrize(("resets", "fires"), [(False, True), (True, False)])
def test_a_loss_jump_at_an_lr_raise_is_a_spike_unless_baselines_reset(resets: bool, fires: bool) -> None:
    user = {"rules": {"LossSpike": {"lr_resets_baseline": resets}}}

    def raised(step: int, rank: int, v: dict[str, Any]) -> None:
        if step == 300:
            sim.lr_change = 300
        if step >= 300:
            v["sentinel_loss"] *= 20.0

    sim = Sim(ranks=1, user=user)
    assert ("LossSpike" in fired(sim.run(0, 310, fault=raised))) is fires


def test_stall_fires_on_tick_resolves_on_next_step_and_retire_stops_it() -> None:
    sim = Sim(ranks=2)
    sim.run(0, 100)
    assert sim.engine.tick(sim.t + 300) == []
    out = sim.engine.tick(sim.t + 700)  # limit: max(600 s, 20 × 0.5 s)
    assert fired(out) == ["TrainingStalled"] and out[0].ranks == (0, 1)
    assert out[0].severity == "critical"
    sim.t += 700
    out = sim.run(100, 101)
    assert [(t.alertname, t.state_to) for t in out] == [("TrainingStalled", "resolved")]
    sim.engine.retire("job", "run")
    assert sim.engine.tick(sim.t + 10_000) == []


def test_retire_resolves_open_alerts() -> None:
    sim = Sim(ranks=1)
    sim.run(0, 305, fault=_nan_everywhere)
    [t] = sim.engine.retire("job", "run", 0)
    assert (t.alertname, t.state_to) == ("TrainingNonFinite", "resolved")


def test_disabled_rule_never_fires() -> None:
    out = Sim(ranks=1, user={"rules": {"TrainingNonFinite": {"enabled": False}}}).run(
        0, 310, fault=_nan_everywhere
    )
    assert "TrainingNonFinite" not in fired(out)


def test_lr_grace_steps_hold_rules_after_an_lr_change() -> None:
    user = {"rules": {"UpdateRatioLow": {"lr_grace_steps": 1000, "warmup_steps": 0}}}

    def tiny_after_decay(step: int, rank: int, v: dict[str, Any]) -> None:
        if step >= 100 and v["sentinel_update_ratio"] is not None:
            v["sentinel_update_ratio"] = 1e-6

    assert Sim(ranks=1, user=user).run(0, 400, fault=tiny_after_decay, lr_decay_at=100) == []


def test_a_second_frame_for_the_same_step_is_not_judged_twice() -> None:
    # GradientSpike would see the jump too (its baseline is complete from step 20)
    user = {"rules": {"GradientExplosion": {"for_steps": 2, "warmup_steps": 0}, "GradientSpike": {"enabled": False}}}
    sim = Sim(ranks=1, user=user)
    sim.run(0, 50)
    labels = labels_of(job="job", run="run", rank=0)
    sim.store.add("sentinel_grad_norm", labels, 50, sim.t, 5000.0)
    assert sim.engine.evaluate("job", "run", 0, 50, sim.t) == []
    assert sim.engine.evaluate("job", "run", 0, 50, sim.t) == []  # e.g. a late log frame
    sim.store.add("sentinel_grad_norm", labels, 51, sim.t, 5000.0)
    assert fired(sim.engine.evaluate("job", "run", 0, 51, sim.t)) == ["GradientExplosion"]
