"""``sentinel daemon``: killed mid-run it costs training nothing; restarted, metrics resume."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

import sentinel
from tests.helpers import MLP, train_steps, wait_for
from tests.integration.test_prometheus import _free_port

pytestmark = pytest.mark.integration


def _daemon(sock: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "sentinel.cli", "daemon", "--socket", str(sock),
                             "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return ""


def test_daemon_killed_and_restarted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sock, port = tmp_path / "run" / "engine.sock", _free_port()
    monkeypatch.setenv("SENTINEL_SOCKET", str(sock))
    daemon = _daemon(sock, port)
    try:
        wait_for(lambda: sock.exists() and "sentinel_daemon_up 1.0" in _metrics(port), what="the daemon")

        def run(monitored: bool) -> tuple[list[torch.Tensor], sentinel.Monitor | None]:
            nonlocal daemon
            torch.manual_seed(0)
            model = MLP()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            mon = sentinel.watch(model, opt, run="restart") if monitored else None
            try:
                train_steps(model, opt, 5, mon)
                if mon is not None:
                    wait_for(lambda: 'run="restart"} 5.0' in _metrics(port), what="step 5")
                    daemon.send_signal(signal.SIGKILL)
                    daemon.wait()
                train_steps(model, opt, 5, mon, seed=1)  # nobody listens: dropped, counted
                if mon is not None:
                    daemon = _daemon(sock, port)
                    wait_for(lambda: "sentinel_daemon_up 1.0" in _metrics(port), what="the restarted daemon")
                train_steps(model, opt, 1, mon, seed=2)
                if mon is not None:  # the first step after the restart reaches it: no reconnect is needed
                    wait_for(lambda: 'sentinel_step{job="train",rank="0",run="restart"} 11.0' in _metrics(port),
                             what="metrics from the restarted daemon")
            finally:
                if mon is not None:
                    mon.close()  # a failure here must not leave a monitor attached for the tests after it
            return [p.detach().clone() for p in model.parameters()], mon

        reference, _ = run(False)
        weights, mon = run(True)
        assert all(torch.equal(a, b) for a, b in zip(reference, weights))
        assert mon is not None and mon.errors == 0 and mon.frames_dropped == 5
        assert 'sentinel_frames_dropped_total{job="train",rank="0",run="restart"} 5.0' in _metrics(port)
    finally:
        daemon.terminate()
        daemon.wait(20)


def test_on_alert_callbacks_reach_a_watched_loop_through_a_shared_daemon(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`watch(on_alert=...)` with a sidecar daemon: the daemon answers on the reply socket
    the frames name, and the callback runs in the training thread at a later step."""
    sock, port = tmp_path / "run" / "engine.sock", _free_port()
    monkeypatch.setenv("SENTINEL_SOCKET", str(sock))
    daemon = _daemon(sock, port)
    try:
        wait_for(lambda: sock.exists() and "sentinel_daemon_up 1.0" in _metrics(port), what="the daemon")
        seen: list[dict[str, object]] = []
        torch.manual_seed(0)
        model = MLP()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        mon = sentinel.watch(model, opt, run="callbacks", on_alert=seen.append)

        def poison(i: int) -> None:
            if i == 3:
                next(model.parameters()).grad.fill_(float("nan"))  # type: ignore[union-attr]

        train_steps(model, opt, 5, mon, before_step=poison)
        wait_for(lambda: (train_steps(model, opt, 1, mon), seen)[1], what="an alert in the callback")
        mon.close()
        firing = [a for a in seen if a["alertname"] == "TrainingNonFinite" and a["state_to"] == "firing"]
        assert firing and firing[0]["run"] == "callbacks" and firing[0]["ranks"] == [0]
        assert not list(sock.parent.glob("reply-*"))  # the reply socket went with the monitor
    finally:
        daemon.terminate()
        daemon.wait(20)
