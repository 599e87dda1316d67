"""The wire format: round trips, and every bad input is a FrameError, never a crash."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel import wire
from sentinel.engine.engine import Engine

GOOD = {"kind": "step", "job": "j", "run": "r", "rank": 0, "step": 3, "t": 1.5,
        "groups": ["a", "b"], "grad_sumsq": [1.0, float("nan")], "delta_sumsq": [None, 2.0]}


def test_round_trip_keeps_nan_and_none() -> None:
    back = wire.decode(wire.encode(GOOD))
    assert back["v"] == wire.SCHEMA_VERSION and back["groups"] == ["a", "b"]
    assert back["grad_sumsq"][1] != back["grad_sumsq"][1]  # NaN survives
    assert back["delta_sumsq"] == [None, 2.0]


@pytest.mark.parametrize(("frame", "why"), [
    ({**GOOD, "v": wire.SCHEMA_VERSION + 1}, "unsupported schema version"),
    ({**GOOD, "v": wire.SCHEMA_VERSION - 2}, "unsupported schema version"),
    ({k: v for k, v in GOOD.items() if k != "run"}, "'run'"),
    ({**GOOD, "rank": "0"}, "'rank'"),
    ({**GOOD, "rank": True}, "'rank'"),
])
def test_invalid_frames_are_rejected(frame: dict[str, object], why: str) -> None:
    data = msgpack.packb({"v": 1, **frame} if "v" not in frame else frame)
    with pytest.raises(wire.FrameError, match=why):
        wire.decode(data)


def test_oversized_frames_are_refused_both_ways() -> None:
    with pytest.raises(wire.FrameError):
        wire.encode({**GOOD, "pad": "x" * wire.MAX_FRAME_BYTES})
    with pytest.raises(wire.FrameError):
        wire.decode(b"\x90" * (wire.MAX_FRAME_BYTES + 1))


_ANY = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(), st.text(max_size=5),
                 st.lists(st.one_of(st.floats(), st.integers(-2**63, 2**63 - 1), st.text(max_size=3), st.none()), max_size=4),
                 st.dictionaries(st.text(max_size=4), st.one_of(st.floats(), st.text(max_size=3), st.none()),
                                 max_size=3))
_OPTIONAL = st.dictionaries(st.sampled_from(
    ["groups", "grad_sumsq", "param_sumsq", "delta_sumsq", "lr", "mem", "scalars", "amp", "sat",
     "state_bytes", "param_bytes", "step_seconds", "grad_l1", "grad_count", "errors", "dropped", "shard"]), _ANY)


@settings(max_examples=400, deadline=None)
@given(st.one_of(
    st.binary(max_size=2000),
    st.builds(lambda opt, kind: msgpack.packb({**GOOD, "kind": kind, **opt}), _OPTIONAL,
              st.sampled_from(["step", "log", "bye", "other"])),
    st.builds(lambda d: msgpack.packb(d), st.dictionaries(st.text(max_size=6), _ANY)),
))
def test_engine_survives_any_bytes(data: bytes) -> None:
    engine = Engine()
    accepted = engine.feed(data)
    assert engine.frames_received == 1
    assert engine.frames_malformed == (0 if accepted else 1)


def test_datagram_sender_rides_out_a_full_socket_queue(tmp_path: object) -> None:
    import os
    import socket

    from sentinel.instrument.sender import DatagramSender

    path = os.path.join(str(tmp_path), "engine.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.setblocking(False)
    tx = DatagramSender(path)
    for i in range(40):  # far more than net.unix.max_dgram_qlen: a slow engine
        assert tx.send(b"frame %d" % i)
    assert tx.dropped == 0
    got: list[bytes] = []
    for _ in range(100):
        while True:
            try:
                got.append(rx.recv(100))
            except BlockingIOError:
                break
        if len(got) == 40:
            break
        tx._flush()  # what the next send() does first
    assert got == [b"frame %d" % i for i in range(40)]  # all of them, in order
    tx.close()
    gone = DatagramSender(os.path.join(str(tmp_path), "nobody.sock"))
    assert not gone.send(b"x") and gone.dropped == 1  # no engine: dropped and counted, not kept
