"""The history of a sharded run holds the whole model's norms (assembled by the engine from
every rank's sums), not rank 0's shards; a replicated (DDP) run keeps rank 0's values."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from sentinel import wire
from sentinel.daemon.service import attach_history
from sentinel.engine.engine import Engine
from sentinel.history import db as hdb
from sentinel.history.query import find_run, series
from sentinel.history.recorder import Recorder

GROUPS = ["a", "b"]


def _frame(rank: int, step: int, gsq: list[float], t0: float, shard: str = "sharded", **extra: Any) -> bytes:
    return wire.encode({"kind": "step", "job": "j", "run": "r", "rank": rank, "world": 2, "step": step,
                        "t": t0 + step, "groups": GROUPS, "grad_sumsq": gsq, "shard": shard, **extra})


def _bye(rank: int, step: int, t0: float) -> bytes:
    return wire.encode({"kind": "bye", "job": "j", "run": "r", "rank": rank, "world": 2, "step": step,
                        "t": t0 + step + 0.5})


def _sharded_run(engine: Engine, steps: int, scale: float, t0: float) -> None:
    """Two ranks' frames, step by step; on even steps rank 1's comes first, so rank 0's own
    frame completes the step (the assembled values reach the history before rank 0's frame)."""
    for s in range(1, steps + 1):
        even = s % 2 == 0
        extra0: dict[str, Any] = {"scalars": {"loss": 10.0 / s}}
        extra1: dict[str, Any] = {}
        if even:  # parameter and update sums every other step, as update_every samples them
            extra0 |= {"param_sumsq": [100.0, 50.0], "delta_sumsq": [1.0, 2.0]}
            extra1 |= {"param_sumsq": [300.0, 50.0], "delta_sumsq": [3.0, 2.0]}
        f0 = _frame(0, s, [scale * s, 2 * scale * s], t0, **extra0)
        f1 = _frame(1, s, [3 * scale * s, 4 * scale * s], t0, **extra1)
        for data in ((f1, f0) if even else (f0, f1)):
            assert engine.feed(data)
    for rank in (0, 1):
        assert engine.feed(_bye(rank, steps, t0))


def _recorded(tmp_path: Path, feed: Any) -> Path:
    path = tmp_path / "h.sqlite"
    engine, rec = Engine(), Recorder(path, flush_seconds=0.05)
    attach_history(engine, rec)  # the wiring every engine (thread, child, daemon) uses
    feed(engine)
    assert rec.flush(30)
    rec.close()
    assert rec.degraded == 0 and engine.ingestor.shards.incomplete == 0
    return path


def test_a_sharded_runs_history_holds_the_whole_models_norms(tmp_path: Path) -> None:
    path = _recorded(tmp_path, lambda e: _sharded_run(e, 6, 1.0, 1000.0))
    db = hdb.connect(path, readonly=True)
    run = find_run(db, "r")
    assert run is not None and run.steps == 6 and run.state == "finished" and run.ranks == 2
    s = series(db, run)
    assert s.steps == [1, 2, 3, 4, 5, 6]
    model = [math.sqrt(10.0 * st) for st in s.steps]  # sqrt of both ranks' sums, not rank 0's sqrt(3 s)
    assert s.columns["grad_norm"] == pytest.approx(model)
    assert s.columns["loss"] == pytest.approx([10.0 / st for st in s.steps])  # rank 0's own values stay
    assert s.columns["param_norm"] == [None, pytest.approx(math.sqrt(500.0))] * 3
    assert s.columns["delta_norm"][1] == pytest.approx(math.sqrt(8.0))
    assert s.columns["update_ratio"][1] == pytest.approx(math.sqrt(8.0 / 500.0))
    assert s.group_steps == s.steps
    for st, grads, params in zip(s.steps, s.group_grad, s.group_param):
        assert grads == pytest.approx([math.sqrt(4.0 * st), math.sqrt(6.0 * st)], rel=1e-6)  # float32
        if st % 2 == 0:
            assert params == pytest.approx([math.sqrt(400.0), math.sqrt(100.0)], rel=1e-6)
    assert run.mean_grad_norm == pytest.approx(sum(model) / 6)  # the aggregate, from the same values
    assert run.mean_delta_norm == pytest.approx(math.sqrt(8.0))


def test_a_sharded_run_under_a_reused_name_gets_its_own_rows_norms(tmp_path: Path) -> None:
    def feed(engine: Engine) -> None:
        _sharded_run(engine, 4, 1.0, 1000.0)
        _sharded_run(engine, 2, 5.0, 2000.0)  # step 2: rank 0's frame completes the new run's step

    db = hdb.connect(_recorded(tmp_path, feed), readonly=True)
    first, second = find_run(db, "r@1"), find_run(db, "r")
    assert first is not None and second is not None and second.attempt == 2
    assert series(db, first).columns["grad_norm"] == pytest.approx([math.sqrt(10.0 * s) for s in (1, 2, 3, 4)])
    assert series(db, second).columns["grad_norm"] == pytest.approx([math.sqrt(50.0 * s) for s in (1, 2)])


def test_a_replicated_runs_history_keeps_rank_0s_values(tmp_path: Path) -> None:
    def feed(engine: Engine) -> None:  # DDP: rank 0's sums are the model's after the all-reduce
        for s in (1, 2, 3):
            assert engine.feed(_frame(0, s, [1.0, 3.0], 1000.0, shard="replicated"))
            assert engine.feed(_frame(1, s, [5.0, 5.0], 1000.0, shard="replicated"))

    db = hdb.connect(_recorded(tmp_path, feed), readonly=True)
    run = find_run(db, "r")
    assert run is not None
    assert series(db, run).columns["grad_norm"] == [2.0, 2.0, 2.0]
