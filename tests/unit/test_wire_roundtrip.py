"""Every message of the wire, in both directions, round-trips through ``sentinel.wire``: what
the training side encodes is what the engine side decodes and accepts (issue 19, part 1).

- frames (step, log, goodbye), encoded from :class:`wire.Frame` as the instrument builds
  them, decoded by the engine's fast path and by its field-by-field path to the same map;
- the version rule: an engine of version N takes frames of N-1, refuses N+1 whole;
- the replies (ready, alert, stop, arm, capture), encoded by the daemon side from the maps
  the service builds and decoded by the training side to the same maps;
- the fast path drops nothing that the field-by-field check would have kept, and takes no
  frame that it would have trimmed (a property test).
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.engine.validate import Limits, check_frame, fits
from sentinel.rules.alert import Transition
from sentinel.store import labels_of

IDENTITY: dict[str, Any] = {"job": "j", "run": "r", "rank": 1, "world": 2}


def _full_step() -> wire.Frame:
    """A step frame with every field the instrument sets (monitor.py, staterecord.py, frames.py)."""
    return wire.Frame(
        kind="step", step=7, t=1000.5, opt="1", groups=["a", "b"], grad_sumsq=[1.0, math.inf],
        param_sumsq=[4.0, 9.0], delta_sumsq=[None, 0.25], delta_l1=[None, 0.5], param_l1=[None, 3.0],
        trust_ratio=[None, 0.9], shard="replicated", ddp=True, clip_norm=2.0, clip_max=math.inf, grad_l1=3.0,
        grad_count=10, sat=[1, 4], opt_health={"adam_sat": [1.0, 4.0]}, lr=[0.1, 0.01], lr_peak=[0.2, math.nan],
        step_seconds=0.1, busy_seconds=0.05, state_bytes={"exp_avg": 64, "exp_avg_sq": 64}, param_bytes=64,
        mem={"host_rss": 1e8, "capacity": 2e9},
        optim=[wire.OptimizerRecord(cls="AdamW", dtype="float32", hp=wire.Hyperparameters(lr=0.1, beta2=0.999)),
               wire.OptimizerRecord(cls="SGD", hp=wire.Hyperparameters(sample_clip=1.0))], total_steps=100,
        env={"torch": "2.13.0", "gpu_model": "none"}, amp=wire.Amp(scale=65536.0), scalars={"loss": 0.5, "acc": 1},
        errors=0, scalars_dropped=2, dropped=3, short_batch=[1, 64], skipped_nonfinite=2, no_gradient=4, not_reset=5,
        rewrite="prune",
        tags={"team": "x"},
        cmd="train.py --lr 0.1",
        reply="/tmp/s/reply-1.sock", **IDENTITY)


def _log_with_guard() -> wire.Frame:
    note = wire.GuardNote(True, "spike", 812.0, 7.1, ("a",), 2, "", 8, "fused")
    return wire.Frame(kind="log", step=7, t=1000.6, guard=note, scalars={"loss": math.nan}, **IDENTITY)


def _bye() -> wire.Frame:
    return wire.Frame(kind="bye", step=7, t=1001.0, exc="RuntimeError", status=1, **IDENTITY)


def _bye_of_a_thread() -> wire.Frame:
    return wire.Frame(kind="bye", step=7, t=1001.0, exc="RuntimeError at app.py:9", thread="Thread-1 (train)",
                      **IDENTITY)


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN, an int equal to the float a typed field makes of it."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a:
        return b != b
    return bool(a == b) and type(a) is type(b) or (type(a) in (int, float) and type(b) in (int, float) and a == b)


@pytest.mark.parametrize("make", [_full_step, _log_with_guard, _bye, _bye_of_a_thread])
def test_a_frame_round_trips_through_both_paths(make: Any) -> None:
    data = wire.encode(make())
    strict = wire.decode_strict(data)
    assert fits(strict, Limits())  # the fast path takes it whole
    fast, lenient = wire.as_map(strict), wire.decode(data)
    assert _same(fast, lenient), (fast, lenient)
    assert fast["v"] == wire.SCHEMA_VERSION
    assert check_frame(lenient, Limits()) == []  # the field-by-field check agrees: nothing to drop
    engine = Engine()
    assert engine.feed(data)
    assert engine.refused == {} and engine.fields_dropped == {} and engine.frames_by_field == 0


def test_the_guard_note_and_the_amp_scale_come_back_as_they_left() -> None:
    frame = wire.as_map(wire.decode_strict(wire.encode(_log_with_guard())))
    assert wire.GuardNote.from_wire(frame["guard"]) == _log_with_guard().guard
    assert frame["guard"]["groups"] == ["a"]
    step = wire.as_map(wire.decode_strict(wire.encode(_full_step())))
    assert step["amp"] == {"scale": 65536.0} and step["sat"] == [1.0, 4.0]
    # the optimizer record under the names the engine and the history read ("class", not "cls")
    assert step["optim"] == [{"class": "AdamW", "dtype": "float32", "hp": {"lr": 0.1, "beta2": 0.999}},
                             {"class": "SGD", "dtype": "none", "hp": {"sample_clip": 1.0}}]


@pytest.mark.parametrize("optim", [
    [{"dtype": "float32", "hp": {}}],  # no class
    [{"class": "SGD", "hp": {"lr": "0.1"}}],  # a setting that is no number
    [{"class": "SGD", "hp": {"lr": math.inf}}],
    [{"class": "SGD"}] * 9,  # more optimizers than a record describes
])
def test_a_bad_optimizer_record_is_dropped_and_counted_and_the_frame_kept(optim: list[Any]) -> None:
    """Both paths hold the record to one type: the fast path refuses it, and the field-by-field
    check (which the frame takes then) drops the field alone, counted, keeping the rest."""
    data = wire.encode({**IDENTITY, "kind": "step", "step": 1, "t": 1.0, "groups": ["a"], "grad_sumsq": [1.0],
                        "optim": optim})
    with pytest.raises(msgspec.ValidationError):
        wire.decode_strict(data)
    engine = Engine()
    assert engine.feed(data)
    assert engine.fields_dropped == {("optim", "schema"): 1}
    assert engine.store.labelsets("sentinel_optimizer_info") == []
    assert engine.store.labelsets("sentinel_grad_norm")


def test_unset_fields_are_not_sent() -> None:
    raw = msgpack.unpackb(wire.encode(wire.Frame(kind="bye", step=1, t=1.0, job="j", run="r", rank=0)))
    assert raw == {"v": wire.SCHEMA_VERSION, "kind": "bye", "job": "j", "run": "r", "rank": 0, "step": 1, "t": 1.0}


def test_a_frame_of_the_previous_version_is_taken_and_a_newer_one_refused_whole() -> None:
    old = {"v": wire.SCHEMA_VERSION - 1, "kind": "step", "job": "j", "run": "r", "rank": 0, "world": 1, "step": 1,
           "t": 5.0, "groups": ["a"], "grad_sumsq": [4.0]}  # version 1: no opt
    engine = Engine()
    assert engine.feed(msgpack.packb(old))
    assert engine.store.last("sentinel_grad_norm", labels_of(job="j", run="r", rank=0))[2] == 2.0  # type: ignore[index]
    assert engine.frames_by_field == 0  # the previous version takes the fast path too
    assert not engine.feed(msgpack.packb({**old, "v": wire.SCHEMA_VERSION + 1, "step": 2}))
    assert engine.refused == {"schema": 1}
    assert not engine.feed(msgpack.packb({k: v for k, v in old.items() if k != "v"}))
    assert engine.refused == {"schema": 2}


def test_a_bad_stream_label_refuses_the_frame_whole() -> None:
    """``opt`` is identity (which stream the values are of), not an optional field."""
    frame = {"v": wire.SCHEMA_VERSION, "kind": "step", "job": "j", "run": "r", "rank": 0, "step": 1, "t": 5.0,
             "opt": "x" * 9, "lr": [0.1]}
    engine = Engine()
    assert not engine.feed(msgpack.packb(frame))
    assert engine.refused == {"schema": 1} and engine.frames_by_field == 1
    assert engine.feed(msgpack.packb({**frame, "opt": "1"}))


def _transition() -> Transition:
    return Transition("grad_spike", "warning", "inactive", "firing", "j", "r", (0, 1), ("layers.0",), 7, 1000.0,
                      math.nan, 3.5, "gradient spike", ("a bad batch",), ("look at batch 7",), "https://x/runbook",
                      True, 5, 990.0)


@pytest.mark.parametrize("msg", [
    {"kind": "ready", "url": "http://127.0.0.1:9400"},
    {"kind": "alert", **_transition().to_json()},
    {"kind": "alert", **_transition().to_json(), "evidence": "/tmp/e/evidence.json"},
    {"kind": "stop", "job": "j", "run": "r", "reason": "sentinel stopped training: grad_spike"},
    {"kind": "arm", "job": "j", "run": "r", "rank": 1, "steps": 4},
    {"kind": "capture", "job": "j", "run": "r", "ranks": [0, 1], "step": 5, "alert_step": 7,
     "alertname": "grad_spike", "folder": "/tmp/e", "max_bytes": 4 << 20},
])
def test_a_reply_round_trips_to_the_same_map(msg: dict[str, Any]) -> None:
    """The maps the service builds (service.py, evidence.py) are what on_alert and the capture
    and stop actions get on the training side."""
    back = wire.decode_message(wire.encode_message(msg))
    assert back == msg


def test_replies_are_typed_both_ways() -> None:
    assert wire.decode_message(wire.encode_message(wire.Stop(job="j", run="r"))) == {
        "kind": "stop", "job": "j", "run": "r", "reason": "sentinel stop action"}
    assert wire.decode_message(msgpack.packb({"kind": "launch", "url": "x"})) is None  # unknown kind
    assert wire.decode_message(msgpack.packb({"kind": "stop", "job": 1, "run": "r"})) is None  # wrong type
    assert wire.decode_message(b"\xc1garbage") is None
    with pytest.raises(wire.FrameError):
        wire.encode_message({"kind": "capture", "job": "j"})  # fields missing: never sent half-made


# -- the fast path takes exactly the frames the field-by-field check leaves whole -----------------

_NUMBERS = st.one_of(st.floats(), st.integers(-3, 2**54), st.booleans(), st.none())
_VALUES = st.one_of(_NUMBERS, st.text(max_size=3), st.lists(_NUMBERS, max_size=3),
                    st.dictionaries(st.text(max_size=3), st.one_of(_NUMBERS, st.text(max_size=2)), max_size=3))
_GOOD: dict[str, Any] = {
    "groups": ["a", "b"], "grad_sumsq": [1.0, 2.0], "param_sumsq": [1, 0.5], "delta_sumsq": [None, 1.0],
    "delta_l1": [0.1, None], "param_l1": [1.0, 2.0], "trust_ratio": [None, None], "shard": "sharded", "ddp": False,
    "clip_norm": 1.0, "clip_max": 0.0, "grad_l1": 2.0, "grad_count": 3, "sat": [0, 0], "lr": [0.1],
    "step_seconds": 0.5, "busy_seconds": 0.0, "state_bytes": {"m": 1}, "param_bytes": 2, "mem": {"x": 1.5},
    "amp": {"scale": 2.0, "skipped": 1}, "scalars": {"loss": 1.0}, "errors": 1, "dropped": 0, "exc": "E",
    "skipped_nonfinite": 3, "no_gradient": 21, "not_reset": 3,
    "status": 0, "thread": "t", "reply": "/r", "where": "w", "tags": {"k": "v"}, "cmd": "c", "opt": "0",
    "guard": {"skipped": False, "reason": "", "norm": 1.0, "bound": 2.0},
    "optim": [{"class": "SGD", "dtype": "float32", "hp": {"lr": 0.1, "momentum": 0.9}}]}


@settings(max_examples=400, deadline=None)
@given(good=st.lists(st.sampled_from(sorted(_GOOD)), unique=True),
       bad=st.dictionaries(st.sampled_from(sorted(_GOOD) + ["world", "rank", "step", "t", "job"]), _VALUES,
                           max_size=3))
def test_the_fast_path_agrees_with_the_field_by_field_check(good: list[str], bad: dict[str, Any]) -> None:
    frame = {"v": wire.SCHEMA_VERSION, "kind": "step", "job": "j", "run": "r", "rank": 0, "world": 1, "step": 2,
             "t": 3.0, **{k: _GOOD[k] for k in good}, **bad}
    data = msgpack.packb(frame)
    limits = Limits()
    try:
        strict: wire.Frame | None = wire.decode_strict(data)
    except Exception:
        strict = None
    if strict is None or not fits(strict, limits):
        return  # the field-by-field path decides, as it always did
    lenient = wire.decode(data)  # raises nothing: the fast path took the identity
    assert check_frame(lenient, limits) == [], frame  # nothing the old check would have dropped
    fast = wire.as_map(strict)
    if "guard" in fast:  # the fast path fills in the note's defaults, as the engine's reading does
        assert wire.GuardNote.from_wire(fast.pop("guard")) == wire.GuardNote.from_wire(lenient.pop("guard"))
    assert _same(fast, lenient)
