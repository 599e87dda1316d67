"""Real CPU training runs with injected faults, judged by the built-in rule pack.

Each scenario (see :mod:`sentinel.demo.scenarios`) trains a small model with a monitor
whose frames an in-process engine ingests step by step. A fault must fire one of its
expected alerts within its target delay (non-finite values within one step, the others
within their rule's window) and nothing serious before the fault; clean runs of three
models with three optimizers must fire no warning or critical alert; a normal loss-scale
overflow must fire nothing at all.
"""

from __future__ import annotations

import pytest

from sentinel.demo.scenarios import SCENARIOS, Scenario, ScenarioResult, run_scenario
from sentinel.demo.tasks import MODELS, MORE_OPTIMIZERS, OPTIMIZERS

FAULTY = [sc for sc in SCENARIOS if sc.expect]
CLEAN = [sc for sc in SCENARIOS if sc.clean]
QUIET = [sc for sc in SCENARIOS if sc.quiet]


def _describe(r: ScenarioResult) -> str:
    return f"{r.scenario.name}: fault at {r.fault_step}, fired " + (
        ", ".join(f"{f.alertname}({f.severity})@{f.step} {list(f.groups)}" for f in r.firings) or "nothing"
    )


@pytest.mark.parametrize("sc", FAULTY, ids=lambda sc: sc.name)
def test_fault_fires_its_alert_in_time(sc: Scenario) -> None:
    r = run_scenario(sc)
    assert r.detected is not None, _describe(r)
    assert r.delay is not None and 0 <= r.delay <= sc.max_delay, _describe(r)
    assert set(sc.expect_groups) <= set(r.detected.groups), _describe(r)
    assert r.false_alerts == [], _describe(r)


@pytest.mark.parametrize("sc", CLEAN, ids=lambda sc: sc.name)
def test_clean_run_fires_no_warning_or_critical(sc: Scenario) -> None:
    r = run_scenario(sc)
    assert r.steps == sc.steps
    assert [f for f in r.firings if f.severity in ("warning", "critical")] == [], _describe(r)


@pytest.mark.parametrize("sc", QUIET, ids=lambda sc: sc.name)
def test_normal_overflow_fires_nothing(sc: Scenario) -> None:
    r = run_scenario(sc)
    assert r.fault_step is not None and r.firings == [], _describe(r)


@pytest.mark.parametrize(
    ("kind", "max_delay"),
    [("nan-loss", 1), ("nan-grad", 1), ("corrupt-batch", 1), ("amp-collapse", 5)],
)
def test_immediate_faults_have_tight_targets(kind: str, max_delay: int) -> None:
    # the table itself: non-finite values and single-step events are due within a step
    assert all(sc.max_delay <= max_delay for sc in FAULTY if sc.fault == kind)


def test_clean_runs_cover_every_model_and_optimizer() -> None:
    pairs = {(sc.model, sc.optimizer) for sc in CLEAN}
    assert {(m, o) for m in MODELS for o in OPTIMIZERS} <= pairs
    # the rest of the seeds' six (Adam, LAMB, Lion, Sophia) on the mlp
    assert {("mlp", o) for o in MORE_OPTIMIZERS} <= pairs


def test_the_first_steps_and_the_schedule_have_scenarios() -> None:
    names = {sc.name for sc in SCENARIOS}
    assert {"lr-high-start", "lr-low-start", "cosine-adamw", "cosine-sgd", "lr-low-cosine"} <= names
