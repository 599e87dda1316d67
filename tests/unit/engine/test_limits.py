"""The engine checks the schema, the ranges and its own caps before anything of a frame is
written (engine/validate.py): a frame whose identity is unreadable, or past the runs,
ranks or series caps, is refused whole; any other bad field is dropped alone, counted,
and the frame's good fields are kept."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel import wire
from sentinel.config import load_config
from sentinel.engine.engine import Engine
from sentinel.engine.validate import Limits
from sentinel.rules.config import ConfigError
from sentinel.store import labels_of

GOOD: dict[str, Any] = {"v": 1, "kind": "step", "job": "j", "run": "r", "rank": 0, "world": 2, "step": 5,
                        "t": 100.0, "groups": ["a", "b"], "grad_sumsq": [1.0, 4.0], "param_sumsq": [9.0, 16.0],
                        "lr": [0.1], "scalars": {"loss": 0.5}, "errors": 0, "dropped": 0}


def _pack(**changes: Any) -> bytes:
    frame = {**GOOD, **changes}
    return msgpack.packb({k: v for k, v in frame.items() if v is not _DROP}, use_bin_type=True)


_DROP = object()


def _contents(engine: Engine) -> list[str]:
    """Everything the store holds, comparably (NaN included)."""
    return sorted(repr(row) for row in engine.store.snapshot())


@pytest.mark.parametrize(("changes", "reason"), [
    ({"step": 2**64 - 1}, "range"),  # once set sentinel_steps_total to 1.8e19
    ({"step": -1}, "range"),
    ({"step": 2**53 + 1}, "range"),
    ({"t": float("nan")}, "range"),
    ({"t": float("inf")}, "range"),
    ({"rank": 2}, "range"),  # rank >= world
    ({"rank": -1}, "range"),
    ({"world": 0}, "range"),
    ({"world": (1 << 20) + 1}, "range"),
    ({"job": ""}, "range"),
    ({"run": "x" * 500}, "range"),
    ({"kind": "other"}, "schema"),
])
def test_a_frame_with_an_unreadable_identity_changes_nothing(changes: dict[str, Any], reason: str) -> None:
    engine = Engine()
    assert engine.feed(_pack())
    before = _contents(engine)
    assert not engine.feed(_pack(**{"step": 6, "t": 101.0, **changes}))
    assert _contents(engine) == before
    assert engine.refused == {reason: 1} and engine.frames_malformed == 1
    # what /metrics says of it (docs/security.md)
    assert ("sentinel_daemon_frames_refused_total", "counter", (("reason", reason),), 1.0) in engine.health_rows()
    assert engine.feed(_pack(step=6, t=101.0))  # the rank goes on reporting as before


_GROUPED = ("groups", "grad_sumsq", "param_sumsq")


@pytest.mark.parametrize(("changes", "field", "reason", "gone"), [
    ({"grad_sumsq": [1.0]}, "grad_sumsq", "schema", ("grad_sumsq",)),  # shorter than groups
    ({"grad_sumsq": [1.0, "2"]}, "grad_sumsq", "schema", ("grad_sumsq",)),
    ({"param_sumsq": [1.0, True]}, "param_sumsq", "schema", ("param_sumsq",)),
    ({"grad_sumsq": [1.0, -4.0]}, "grad_sumsq", "range", ("grad_sumsq",)),
    ({"groups": _DROP}, "grad_sumsq", "schema", _GROUPED),  # sums without their groups
    ({"groups": [1, 2]}, "groups", "schema", _GROUPED),
    ({"groups": [f"g{i}" for i in range(1700)], "grad_sumsq": [1.0] * 1700, "param_sumsq": _DROP}, "groups",
     "groups", _GROUPED),
    ({"groups": ["a", "x" * 300]}, "groups", "range", _GROUPED),
    ({"lr": [0.1, float("nan")]}, "lr", "range", ("lr",)),
    ({"lr": "0.1"}, "lr", "schema", ("lr",)),
    ({"lr": [0.1] * 1000}, "lr", "range", ("lr",)),
    ({"step_seconds": -1.0}, "step_seconds", "range", ("step_seconds",)),
    ({"sat": [5, 3]}, "sat", "range", ("sat",)),
    ({"mem": {"host_rss": "big"}}, "mem", "range", ("mem",)),
    ({"state_bytes": {f"k{i}": 1 for i in range(500)}}, "state_bytes", "range", ("state_bytes",)),
    ({"amp": {"scale": -1.0}}, "amp", "range", ("amp",)),
    ({"errors": 2**60}, "errors", "range", ("errors",)),
    ({"shard": "diagonal"}, "shard", "range", ("shard",)),
    ({"rewrite": "format_c"}, "rewrite", "range", ("rewrite",)),
    ({"short_batch": [1, -64]}, "short_batch", "range", ("short_batch",)),
    ({"clip_max": float("nan")}, "clip_max", "range", ("clip_max",)),
    ({"scalars": {f"s{i}": 1.0 for i in range(100)}}, "scalars", "scalars", ("scalars",)),
])
def test_a_bad_field_is_dropped_and_the_rest_of_the_frame_kept(changes: dict[str, Any], field: str, reason: str,
                                                               gone: tuple[str, ...]) -> None:
    engine = Engine()
    assert engine.feed(_pack(**{"step": 6, "t": 101.0, **changes}))
    assert engine.refused == {} and engine.fields_dropped == {(field, reason): 1}
    base = labels_of(job="j", run="r", rank=0)
    assert engine.store.counter("sentinel_steps_total", base) == 6.0  # the step itself counts
    kept = {"lr": ("sentinel_learning_rate", labels_of(job="j", run="r", rank=0, param_group="0")),
            "grad_sumsq": ("sentinel_grad_norm", base),
            "scalars": ("sentinel_loss", base)}
    for key, (metric, labels) in kept.items():
        if key not in gone:  # every field that was good made it in
            assert engine.store.last(metric, labels) is not None, key
        else:
            assert engine.store.last(metric, labels) is None, key
    rows = {r[0]: r for r in engine.health_rows()}
    assert rows["sentinel_daemon_frame_fields_dropped_total"][2] == (("field", field), ("reason", reason))


def test_a_bad_scalar_is_dropped_alone() -> None:
    engine = Engine()
    assert engine.feed(_pack(scalars={"loss": 0.5, "acc": "high", "a b": 1.0, "x" * 200: 2.0}))
    base = labels_of(job="j", run="r", rank=0)
    assert engine.store.last("sentinel_loss", base)[2] == 0.5  # type: ignore[index]
    assert engine.fields_dropped == {("scalars", "schema"): 1, ("scalars", "scalars"): 2}


def test_clipping_off_with_max_norm_inf_is_kept() -> None:
    """A framework that reads the norm through clip_grad_norm_(max_norm=inf), clipping off."""
    engine = Engine()
    assert engine.feed(_pack(clip_norm=3.0, clip_max=float("inf")))
    assert engine.refused == {} and engine.fields_dropped == {}
    base = labels_of(job="j", run="r", rank=0)
    assert engine.store.last("sentinel_grad_norm_preclip", base)[2] == 3.0  # type: ignore[index]
    assert engine.store.last("sentinel_grad_norm", base) is not None


def test_an_oversized_frame_changes_nothing() -> None:
    engine = Engine(limits=Limits(max_frame_bytes=2000))
    assert engine.feed(_pack())
    before = _contents(engine)
    assert not engine.feed(_pack(step=6, pad="x" * 3000))
    assert _contents(engine) == before and engine.refused == {"size": 1}


@pytest.mark.parametrize(("limits", "frames", "reason"), [
    # runs: the third run is refused; its series never appear
    (Limits(max_runs=2), [{"run": "r0"}, {"run": "r1"}, {"run": "r2"}], "runs"),
    (Limits(max_ranks=2), [{"rank": 0, "world": _DROP}, {"rank": 1, "world": _DROP},
                           {"rank": 2, "world": _DROP}], "ranks"),  # a third rank of the run, without world
    (Limits(max_ranks=2), [{"rank": 0, "world": 2}, {"rank": 1, "world": 2}, {"rank": 1, "run": "x"},
                           {"rank": 2, "world": 3}], "ranks"),
    (Limits(max_ranks=2), [{"rank": 8192, "world": 16384}, {"rank": 8193, "world": 16384},
                           {"rank": 8194, "world": 16384}], "ranks"),
    # the series estimate: 60 a rank + 5 a group + ...; the second rank no longer fits
    (Limits(max_series=100), [{"rank": 0}, {"rank": 1}], "series"),
])
def test_caps_are_enforced_by_the_engine(limits: Limits, frames: list[dict[str, Any]], reason: str) -> None:
    engine = Engine(limits=limits)
    for i, changes in enumerate(frames[:-1]):
        assert engine.feed(_pack(step=i + 1, **changes)), changes
    before = _contents(engine)
    assert not engine.feed(_pack(step=len(frames), **frames[-1]))
    assert _contents(engine) == before
    assert engine.refused == {reason: 1}


def test_a_node_of_a_job_larger_than_the_ranks_one_engine_tracks_is_watched() -> None:
    """A node's daemon hears its node's 8 ranks of a 16,384-rank job (the largest trainings
    run on tens of thousands of accelerators): the engine takes their frames, whose ``world``
    is the job's and whose ranks are numbered from 8,192. ``limits.max_ranks`` bounds the
    ranks one engine tracks in a run, not the job's size: every frame of such a job was
    refused (``world`` above 4,096), and its nodes were watched by nothing."""
    engine = Engine()
    for step in (1, 2):
        for rank in range(8192, 8200):
            assert engine.feed(_pack(rank=rank, world=16384, step=step)), (rank, step)
    assert engine.refused == {} and engine.frames_malformed == 0
    for rank in (8192, 8199):
        last = engine.store.last("sentinel_grad_norm", labels_of(job="j", run="r", rank=rank))
        assert last is not None and last[0] == 2 and last[2] == pytest.approx(5 ** 0.5)


@pytest.mark.parametrize(("limits", "frames", "field"), [
    # distinct group names of one rank, however they are spread over frames
    (Limits(max_groups=3), [{"groups": ["a", "b"]}, {"groups": ["c", "a"]}, {"groups": ["d", "a"]}], "groups"),
    (Limits(max_scalar_names=3), [{"scalars": {"a": 1.0, "b": 1.0}}, {"scalars": {"c": 1.0}},
                                  {"scalars": {"d": 1.0}}], "scalars"),
])
def test_names_past_a_cap_are_dropped_and_the_frame_kept(limits: Limits, frames: list[dict[str, Any]],
                                                         field: str) -> None:
    engine = Engine(limits=limits)
    for i, changes in enumerate(frames):
        assert engine.feed(_pack(step=i + 1, t=100.0 + i, **changes)), changes
    assert engine.refused == {} and engine.fields_dropped == {(field, field): 1}
    names = {dict(ls).get("group") or dict(ls).get("name") for n in engine.store.names()
             for ls in engine.store.labelsets(n)}
    assert "d" not in names and "c" in names
    assert engine.store.counter("sentinel_steps_total", labels_of(job="j", run="r", rank=0)) == 3.0


def test_a_forgotten_run_frees_its_place() -> None:
    now = [1000.0]
    engine = Engine(limits=Limits(max_runs=1), clock=lambda: now[0], ended_ttl=10.0)
    assert engine.feed(_pack(run="a", t=1000.0))
    assert engine.feed(_pack(run="a", kind="bye", t=1000.0))
    assert engine.feed(_pack(run="a", rank=1, kind="bye", t=1000.0))
    assert not engine.feed(_pack(run="b", t=1001.0))  # the daemon is full
    now[0] = 1100.0
    engine.tick(now[0])  # run a ended long enough ago: forgotten
    assert engine.feed(_pack(run="b", t=1100.0))


def test_user_scalars_are_exported_by_name() -> None:
    engine = Engine()
    assert engine.feed(_pack(scalars={"loss": 0.5, "acc": 0.75, "train/top-5": 0.9}))
    base = dict(job="j", run="r", rank=0)
    assert engine.store.last("sentinel_scalar", labels_of(**base, name="acc"))[2] == 0.75  # type: ignore[index]
    assert engine.store.last("sentinel_scalar", labels_of(**base, name="train/top-5"))[2] == 0.9  # type: ignore[index]
    assert engine.refused == {}


def test_frames_the_instrument_sends_pass() -> None:
    """Every optional field in the shapes the instrument sends (frames.py, monitor.py)."""
    frame = {**GOOD, "delta_sumsq": [None, 0.5], "shard": "replicated", "ddp": True, "clip_norm": float("inf"),
             "clip_max": 1.0, "grad_l1": 3.0, "grad_count": 10, "sat": [1, 4], "step_seconds": 0.1,
             "busy_seconds": 0.05, "state_bytes": {"exp_avg": 64, "exp_avg_sq": 64}, "param_bytes": 64,
             "mem": {"host_rss": 1e8, "capacity": 2e9}, "amp": {"scale": 65536.0},
             "reply": "/tmp/x/reply-1.sock", "grad_sumsq": [float("nan"), float("inf")]}
    engine = Engine()
    assert engine.feed(wire.encode({k: v for k, v in frame.items() if k != "v"}))
    assert engine.feed(wire.encode({"kind": "bye", "job": "j", "run": "r", "rank": 0, "world": 2, "step": 5,
                                    "t": 101.0, "exc": "RuntimeError"}))
    assert engine.refused == {}


def test_limits_come_from_the_config_file() -> None:
    cfg, _ = load_config({"limits": {"max_runs": 3, "max_groups": 16}})
    assert cfg.limits.limits() == Limits(max_runs=3, max_groups=16)
    with pytest.raises(ConfigError, match=r"limits\.max_series: "):
        load_config({"limits": {"max_series": 0}})
    with pytest.raises(ConfigError, match=r"limits\.max_frame_bytes: "):
        load_config({"limits": {"max_frame_bytes": 10**6}})  # more than a datagram carries


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=8),
                    st.lists(st.one_of(st.floats(), st.integers(-5, 5), st.none(), st.text(max_size=2)), max_size=5),
                    st.dictionaries(st.text(max_size=6),  # integers msgpack can carry, as the wire does
                                    st.one_of(st.floats(), st.integers(-2**63, 2**64 - 1), st.text(max_size=2)),
                                    max_size=4))
_KEYS = st.sampled_from(sorted({*GOOD, "world", "groups", "grad_sumsq", "param_sumsq", "delta_sumsq", "lr", "mem",
                                "scalars", "amp", "sat", "state_bytes", "param_bytes", "step_seconds",
                                "busy_seconds", "grad_l1", "grad_count", "clip_norm", "clip_max", "shard", "ddp",
                                "exc", "reply", "where"} - {"v"}))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, min_size=1, max_size=4))
def test_fuzzed_frames_are_ingested_whole_or_change_nothing(changes: dict[str, Any]) -> None:
    engine = Engine()
    assert engine.feed(_pack())
    before = _contents(engine)
    accepted = engine.feed(_pack(**{"step": 6, "t": 101.0, **changes}))
    assert engine.refused.get("error", 0) == 0  # the checks let nothing through that ingest cannot take
    if not accepted:  # only an unreadable identity (or a cap) refuses a frame whole
        assert _contents(engine) == before
        assert sum(engine.refused.values()) == engine.frames_malformed == 1
        assert set(changes) & {"kind", "job", "run", "rank", "world", "step", "t"}
