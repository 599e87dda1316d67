"""Assembling the global norms of a sharded run from its ranks' frames (engine side)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.engine.shards import MAX_STEPS
from sentinel.store import labels_of

GROUPS = ["a", "b"]


def _frame(rank: int, step: int, gsq: list[float], world: int = 2, **extra: Any) -> bytes:
    return wire.encode({"kind": "step", "job": "j", "run": "r", "rank": rank, "world": world, "step": step,
                        "t": 100.0 + step, "groups": GROUPS, "grad_sumsq": gsq, "shard": "sharded", **extra})


def _last(engine: Engine, name: str, rank: int, **extra: str) -> float | None:
    got = engine.store.last(name, labels_of(job="j", run="r", rank=rank, **extra))
    return None if got is None else got[2]


def test_global_norm_is_written_for_every_rank_once_all_frames_are_in() -> None:
    e = Engine()
    assert e.feed(_frame(0, 1, [1.0, 4.0]))
    assert _last(e, "sentinel_grad_norm", 0) is None  # rank 1's shard is still missing
    assert _last(e, "sentinel_local_grad_norm", 0) == pytest.approx(math.sqrt(5.0))
    assert e.feed(_frame(1, 1, [3.0, 8.0]))
    for rank in (0, 1):
        assert _last(e, "sentinel_grad_norm", rank) == pytest.approx(4.0)  # sqrt(1+4+3+8)
        assert _last(e, "sentinel_group_grad_norm", rank, group="a") == pytest.approx(2.0)
        assert _last(e, "sentinel_group_grad_norm", rank, group="b") == pytest.approx(math.sqrt(12.0))
    assert _last(e, "sentinel_local_grad_norm", 1) == pytest.approx(math.sqrt(11.0))
    assert e.ingestor.shards.assembled == 1


def test_replicated_frames_are_untouched() -> None:
    e = Engine()
    e.feed(wire.encode({"kind": "step", "job": "j", "run": "r", "rank": 0, "world": 2, "step": 1, "t": 1.0,
                        "groups": GROUPS, "grad_sumsq": [1.0, 3.0], "shard": "replicated"}))
    assert _last(e, "sentinel_grad_norm", 0) == pytest.approx(2.0)
    assert _last(e, "sentinel_local_grad_norm", 0) is None


def test_param_norm_and_update_ratio_are_assembled() -> None:
    e = Engine()
    e.feed(_frame(0, 1, [1.0, 1.0], param_sumsq=[100.0, 50.0], delta_sumsq=[1.0, None]))
    e.feed(_frame(1, 1, [1.0, 1.0], param_sumsq=[300.0, 50.0], delta_sumsq=[3.0, 2.0]))
    assert _last(e, "sentinel_param_norm", 1) == pytest.approx(math.sqrt(500.0))
    assert _last(e, "sentinel_group_update_ratio", 0, group="a") == pytest.approx(math.sqrt(4.0 / 400.0))
    assert _last(e, "sentinel_group_update_ratio", 0, group="b") is None  # rank 0 did not sample it
    assert _last(e, "sentinel_update_ratio", 0) == pytest.approx(math.sqrt(4.0 / 400.0))


def test_snr_uses_all_ranks() -> None:
    e = Engine()
    e.feed(_frame(0, 1, [4.0, 0.0], grad_l1=2.0, grad_count=2))  # elements 2, 0
    e.feed(_frame(1, 1, [1.0, 1.0], grad_l1=2.0, grad_count=2))  # elements 1, 1
    # all four: mean |g| = 1, mean g^2 = 1.5, std = sqrt(0.5)
    assert _last(e, "sentinel_gradient_snr", 0) == pytest.approx(1 / math.sqrt(0.5))


def test_a_missing_frame_drops_its_step_and_counts_it() -> None:
    e = Engine()
    e.feed(_frame(0, 1, [1.0, 1.0]))  # rank 1's frame for step 1 is lost
    e.feed(_frame(0, 2, [1.0, 1.0]))
    e.feed(_frame(1, 2, [1.0, 1.0]))
    shards = e.ingestor.shards
    assert shards.assembled == 1 and shards.incomplete == 1
    assert e.store.counter("sentinel_shard_steps_incomplete_total", labels_of(job="j", run="r", rank=0)) == 1
    assert e.store.window("sentinel_grad_norm", labels_of(job="j", run="r", rank=0)).steps.tolist() == [2]  # type: ignore[union-attr]


def test_waiting_steps_are_bounded() -> None:
    e = Engine()
    for step in range(1, 5 * MAX_STEPS):
        e.feed(_frame(0, step, [1.0, 1.0]))  # rank 1 never reports
    steps = e.ingestor.shards._runs[("j", "r")]
    assert len(steps) <= MAX_STEPS
    assert e.ingestor.shards.incomplete == 5 * MAX_STEPS - 1 - len(steps)


def test_a_frame_without_world_keeps_local_norms_only() -> None:
    e = Engine()
    assert e.feed(_frame(0, 1, [1.0, 1.0], world=None))
    assert _last(e, "sentinel_local_grad_norm", 0) == pytest.approx(math.sqrt(2.0))
    assert _last(e, "sentinel_grad_norm", 0) is None


@pytest.mark.parametrize("world", [0, (1 << 20) + 1, "2"])
def test_an_unusable_world_is_refused_whole(world: Any) -> None:
    e = Engine()
    assert not e.feed(_frame(0, 1, [1.0, 1.0], world=world))
    assert e.store.names() == [] and e.frames_malformed == 1


def test_nonfinite_shard_flags_its_rank_at_once() -> None:
    e = Engine()
    e.feed(_frame(1, 1, [float("nan"), 1.0]))
    assert _last(e, "sentinel_nonfinite_detected", 1, source="grad") == 1.0
    assert e.store.counter("sentinel_nonfinite_total", labels_of(job="j", run="r", rank=1, source="grad")) == 1


def test_gradient_spike_rule_judges_the_assembled_norm() -> None:
    e = Engine()
    for step in range(1, 80):
        big = step == 70
        for rank in (0, 1):
            e.feed(_frame(rank, step, [1e6 if big else 1.0, 1.0]))
    fired = [t for t in e.transitions if t.alertname == "GradientSpike" and t.state_to == "firing"]
    assert fired, [t.summary for t in e.transitions]


class _Placement:
    def __init__(self, shard: bool) -> None:
        self.shard = shard

    def is_shard(self) -> bool:
        return self.shard


class _Mesh:
    def __init__(self, coord: list[int] | None) -> None:
        self.coord = coord

    def get_coordinate(self) -> list[int] | None:
        return self.coord


class _FakeDTensor:
    """What shard_plan reads of a DTensor: its mesh coordinate and placements."""

    def __init__(self, coord: list[int] | None, *shard: bool) -> None:
        self.device_mesh = _Mesh(coord)
        self.placements = [_Placement(s) for s in shard]


S, R = True, False  # Shard / Replicate on a mesh dimension


@pytest.mark.parametrize(("coord", "placements", "counts"), [
    ([0], (S,), True),  # FSDP: every rank counts its shard
    ([1], (S,), True),
    ([0, 1], (R, S), True),  # HSDP: replica 0 counts its shard
    ([1, 1], (R, S), False),  # another replica holds the same shard: not counted again
    ([1], (R,), False),  # a replicated DTensor counts on coordinate 0 only
    (None, (S,), False),  # this rank is not in the mesh
])
def test_shard_plan_counts_each_element_once(monkeypatch: pytest.MonkeyPatch, coord: Any,
                                             placements: tuple[bool, ...], counts: bool) -> None:
    import torch

    from sentinel.instrument import stats

    monkeypatch.setattr(stats, "_dtensor_type", lambda: _FakeDTensor)
    plain = torch.zeros(1)
    for rank in (0, 1):
        sharded, keep = stats.shard_plan([_FakeDTensor(coord, *placements), plain], rank)  # type: ignore[list-item]
        assert sharded and keep == [counts, rank == 0]  # a plain tensor beside DTensors: rank 0 only
    assert stats.shard_plan([plain], 1) == (False, [True])
