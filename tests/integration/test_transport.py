"""The local transport: private socket, refused strangers, bad frames counted, and a dead
engine that costs training nothing but counted drops."""

from __future__ import annotations

import os
import signal
import socket
import stat
import urllib.request

import pytest
import torch

import sentinel
from sentinel import wire
from tests.helpers import MLP, train_steps, wait_for

pytestmark = pytest.mark.integration


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return r.read().decode()


@pytest.fixture
def mon() -> sentinel.Monitor:
    torch.manual_seed(0)
    model = MLP()
    m = sentinel.watch(model, torch.optim.SGD(model.parameters(), lr=0.01), listen="127.0.0.1:0", run="t")
    m._test_model = model  # type: ignore[attr-defined]
    yield m
    m.close()


def test_socket_is_private(mon: sentinel.Monitor) -> None:
    path = mon.engine.socket_path  # type: ignore[union-attr]
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert mon.url is not None and mon.url.startswith("http://127.0.0.1:")


def test_bad_frames_are_counted_and_the_engine_keeps_going(mon: sentinel.Monitor) -> None:
    path = mon.engine.socket_path  # type: ignore[union-attr]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    good = wire.encode({"kind": "step", "job": "j", "run": "x", "rank": 3, "step": 1, "t": 1.0})
    bad = [b"\xc1garbage", good[:-3], wire.encode({"kind": "step"}),
           good.replace(b"\xa1v" + bytes([wire.SCHEMA_VERSION]), b"\xa1v\x07", 1)]  # truncated, missing fields, version 7
    for frame in bad:
        s.sendto(frame, path)
    s.sendto(b"\x00" * (wire.MAX_FRAME_BYTES + 10), path)  # oversized
    s.sendto(good, path)
    wait_for(lambda: "sentinel_daemon_frames_malformed_total 4.0" in _metrics(mon.url)
             and "sentinel_daemon_frames_oversized_total 1.0" in _metrics(mon.url),
             what="bad frames counted")
    assert 'sentinel_step{job="j",rank="3",run="x"} 1.0' in _metrics(mon.url)  # the good one got in


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to send as another uid")
def test_frames_from_another_uid_are_refused(mon: sentinel.Monitor) -> None:
    path = mon.engine.socket_path  # type: ignore[union-attr]
    os.chmod(os.path.dirname(path), 0o755)  # open the doors the listener closed: test the uid check itself
    os.chmod(path, 0o666)
    frame = wire.encode({"kind": "step", "job": "j", "run": "evil", "rank": 9, "step": 1, "t": 1.0})
    pid = os.fork()
    if pid == 0:  # the child becomes "nobody" and sends
        try:
            os.setgid(65534)
            os.setuid(65534)
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(frame, path)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    wait_for(lambda: 'sentinel_daemon_frames_refused_total{reason="uid"} 1.0' in _metrics(mon.url), what="refusal counted")
    assert 'run="evil"' not in _metrics(mon.url)


def test_killed_engine_leaves_training_untouched() -> None:
    def run(monitored: bool, kill_at: int = 5) -> tuple[list[torch.Tensor], sentinel.Monitor | None]:
        torch.manual_seed(0)
        model = MLP()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        mon = sentinel.watch(model, opt, listen="127.0.0.1:0") if monitored else None

        def maybe_kill(i: int) -> None:
            if mon is not None and i == kill_at:
                mon.engine.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
                mon.engine.proc.wait()  # type: ignore[union-attr]

        train_steps(model, opt, 20, mon, before_step=maybe_kill)
        if mon is not None:
            mon.close()
        return [p.detach().clone() for p in model.parameters()], mon

    reference, _ = run(False)
    weights, mon = run(True)
    assert all(torch.equal(a, b) for a, b in zip(reference, weights))
    assert mon is not None and mon.errors == 0
    assert mon.frames_dropped >= 14  # steps 6..20 (+ bye) found no engine: dropped and counted


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to create a folder as another uid")
def test_socket_folder_owned_by_someone_else_is_refused(tmp_path: object) -> None:
    from sentinel.daemon.listener import DatagramListener

    folder = os.path.join(str(tmp_path), "planted")
    os.mkdir(folder, 0o777)
    os.chown(folder, 65534, 65534)  # "nobody" got there first
    with pytest.raises(PermissionError, match="belongs to uid 65534"):
        DatagramListener(os.path.join(folder, "engine.sock"), lambda batch: None)
