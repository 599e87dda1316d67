"""Cross-rank comparison in the engine: replicated grad norms and busy times, per step."""

from __future__ import annotations

from typing import Any

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.store import labels_of


def _frame(rank: int, step: int, norm: float, busy: float, world: int = 3, ddp: bool = True) -> bytes:
    f: dict[str, Any] = {"kind": "step", "job": "j", "run": "r", "rank": rank, "world": world, "step": step,
                         "t": float(step), "groups": ["a"], "grad_sumsq": [norm * norm], "busy_seconds": busy}
    if ddp:
        f["ddp"] = True
    return wire.encode(f)


def _run(engine: Engine, steps: range, norm: dict[int, float], busy: dict[int, float], **kw: Any) -> None:
    for step in steps:
        for rank in sorted(norm):
            assert engine.feed(_frame(rank, step, norm[rank], busy[rank], world=len(norm), **kw))


def _last(engine: Engine, name: str, rank: int) -> float | None:
    last = engine.store.last(name, labels_of(job="j", run="r", rank=rank))
    return None if last is None else last[2]


def test_equal_replicas_are_quiet_and_the_odd_rank_is_named() -> None:
    engine = Engine(clock=lambda: 0.0)
    _run(engine, range(0, 30), {0: 1.0, 1: 1.0, 2: 1.0}, {0: 0.1, 1: 0.1, 2: 0.1})
    assert _last(engine, "sentinel_rank_grad_norm_deviation", 2) == 0.0
    assert not engine.alerts_json()
    _run(engine, range(30, 32), {0: 1.0, 1: 1.0, 2: 1.3}, {0: 0.1, 1: 0.1, 2: 0.1})  # rank 2 desynced
    alert = next(a for a in engine.alerts_json() if a["alertname"] == "RankDivergence")
    assert alert["ranks"] == [2] and abs(alert["value"] - 0.3) < 1e-9


def test_a_slow_rank_is_a_straggler_the_others_are_not() -> None:
    engine = Engine(clock=lambda: 0.0)
    _run(engine, range(0, 60), {0: 1.0, 1: 1.0, 2: 1.0}, {0: 0.05, 1: 0.05, 2: 0.2})
    assert _last(engine, "sentinel_rank_step_time_ratio", 2) == 4.0
    assert _last(engine, "sentinel_rank_step_time_ratio", 0) == 0.4  # 0.05 over the median of 0.05 and 0.2
    engine.tick(now=10.0)  # past the group wait: only one of the three ranks fails
    alert = next(a for a in engine.alerts_json() if a["alertname"] == "RankStraggler")
    assert alert["ranks"] == [2] and alert["state"] == "firing"


def test_millisecond_steps_are_not_stragglers() -> None:
    engine = Engine(clock=lambda: 0.0)
    _run(engine, range(0, 60), {0: 1.0, 1: 1.0}, {0: 0.001, 1: 0.004})
    assert not [a for a in engine.alerts_json() if a["alertname"] == "RankStraggler"]


def test_without_ddp_norms_are_not_compared() -> None:
    """Pipeline or independent ranks hold different parameters: their norms legitimately differ."""
    engine = Engine(clock=lambda: 0.0)
    _run(engine, range(0, 30), {0: 1.0, 1: 5.0}, {0: 0.1, 1: 0.1}, ddp=False)
    assert _last(engine, "sentinel_rank_grad_norm_deviation", 1) is None
    assert not engine.alerts_json()


def test_a_step_one_rank_never_reports_is_dropped_not_kept() -> None:
    engine = Engine(clock=lambda: 0.0)
    for step in range(100):  # rank 1 reports nothing: the pending steps stay bounded
        engine.feed(_frame(0, step, 1.0, 0.1, world=2))
    run = engine.ingestor.crossrank._runs[("j", "r", "")]
    assert len(run.pending) <= 8
