"""Delivery through a real daemon: it survives a SIGKILL between storing and sending, and
the alert record keeps the step where the trouble began."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml

import sentinel
from tests.helpers import MLP, Receiver, train_steps, wait_for
from tests.integration.test_daemon import _metrics
from tests.integration.test_prometheus import _free_port

pytestmark = pytest.mark.integration


def _pending_attempted(db_path: Path) -> bool:
    if not db_path.exists():
        return False
    with sqlite3.connect(db_path) as db:
        return bool(db.execute("SELECT COUNT(*) FROM outbox WHERE state='pending' AND attempts >= 1").fetchone()[0])


def test_daemon_sigkilled_between_storing_and_delivering_delivers_after_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chat_port, port, sock = _free_port(), _free_port(), tmp_path / "run" / "engine.sock"
    outbox = tmp_path / "outbox.sqlite"
    cfg = tmp_path / "sentinel.yaml"
    cfg.write_text(yaml.safe_dump({
        "notify": {"urls": [f"json://127.0.0.1:{chat_port}/"]},  # the chat service is down
        "outbox": {"path": str(outbox), "retry_initial_seconds": 0.2, "retry_max_seconds": 0.5}}))
    cmd = [sys.executable, "-m", "sentinel.cli", "daemon", "--config", str(cfg), "--socket", str(sock),
           "--listen", f"127.0.0.1:{port}"]
    monkeypatch.setenv("SENTINEL_SOCKET", str(sock))
    daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    receiver: Receiver | None = None
    mon = None
    try:
        wait_for(lambda: sock.exists() and "sentinel_daemon_up 1.0" in _metrics(port), timeout=30, what="the daemon")
        torch.manual_seed(0)
        model = MLP()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        mon = sentinel.watch(model, opt, run="killed")

        def poison(i: int) -> None:
            if i >= 3:
                model.head.weight.grad[0, 0] = float("nan")  # type: ignore[index]

        train_steps(model, opt, 6, mon, before_step=poison)
        wait_for(lambda: _pending_attempted(outbox), timeout=30, what="the alert stored, its delivery failing")
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        receiver = Receiver(port=chat_port)  # the chat service is back
        daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: any("TrainingNonFinite" in b.get("title", "") for b in receiver.bodies),  # type: ignore[union-attr]
                 timeout=30, what="the alert delivered by the restarted daemon")
        wait_for(lambda: "sentinel_outbox_depth 0.0" in _metrics(port), what="an empty outbox")
        firing = [b for b in receiver.bodies if "TrainingNonFinite" in b["title"]]
        assert len(firing) == 1 and "[FIRING]" in firing[0]["title"] and "since step 4" in firing[0]["title"]
    finally:
        if mon is not None:
            mon.close()
        daemon.terminate()
        daemon.wait(20)
        if receiver is not None:
            receiver.close()


def test_started_step_is_the_injected_step_after_hundreds_of_firing_steps(tmp_path: Path) -> None:
    receiver = Receiver()
    cfg = tmp_path / "sentinel.yaml"
    cfg.write_text(yaml.safe_dump({"notify": {"urls": [receiver.url]}}))
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", run="long", config=str(cfg), engine="thread")
    try:
        def poison(i: int) -> None:
            if i >= 49:  # step 50 on
                model.layers[1][0].weight.grad[0, 0] = float("nan")  # type: ignore[index]

        train_steps(model, opt, 350, mon, before_step=poison)
        assert mon.engine is not None and mon.engine.flush(10)  # type: ignore[attr-defined]
        with urllib.request.urlopen(mon.url + "/api/v1/alerts", timeout=5) as r:
            alerts = json.load(r)["data"]["alerts"]
        [a] = [a for a in alerts if a["alertname"] == "TrainingNonFinite"]
        assert a["state"] == "firing" and a["started_step"] == 50 and a["last_step"] == 350
        assert "at step 50" in a["summary"]
        wait_for(lambda: receiver.bodies, what="the message")
        [msg] = [b for b in receiver.bodies if "TrainingNonFinite" in b["title"]]
        assert "since step 50" in msg["title"] and "started at step: 50" in msg["message"]
    finally:
        mon.close()
        receiver.close()
