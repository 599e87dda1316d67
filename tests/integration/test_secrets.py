"""Secrets never leak: every URL and token is set to a recognisable value, failures are
driven (an unparseable URL, a receiver answering 500, a timeout, a closed port), and the
token appears in no log line at any level, error, CLI output, API response or page."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import sentinel
from tests.helpers import MLP, Receiver, train_steps, wait_for
from tests.integration.test_prometheus import _free_port

pytestmark = pytest.mark.integration

TOKEN = "S3cr3tT0kenXYZ"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sentinel.cli", "-v", *args], capture_output=True, text=True,
                          timeout=120)


def _write(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "sentinel.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_an_unparseable_url_is_a_config_error_named_by_key_and_scheme(tmp_path: Path) -> None:
    cfg = _write(tmp_path, {"notify": {
        "urls": ["json://127.0.0.1:9/", f"slak://{TOKEN}/B000/XXXX"],  # a typo of slack://
        "routes": [{"urls": [f"discord://{TOKEN}"]}]}})  # discord:// lacks its token part
    out = _cli("check-config", cfg)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "notify.urls.1: cannot parse a slak:// URL" in out.stderr
    assert "notify.routes.0.urls.0: cannot parse a discord:// URL" in out.stderr
    assert TOKEN not in out.stdout + out.stderr
    for cmd in (["daemon", "--config", cfg, "--socket", str(tmp_path / "s" / "e.sock"), "--listen", "127.0.0.1:0"],
                ["run", "--config", cfg, "--", sys.executable, "-c", "pass"], ["alerts", "test", "--config", cfg]):
        out = _cli(*cmd)
        assert out.returncode == 2 and "Traceback" not in out.stderr, cmd
        assert "notify.urls.1: cannot parse a slak:// URL" in out.stderr
        assert TOKEN not in out.stdout + out.stderr


@pytest.fixture
def failing_targets() -> Iterator[dict[str, Any]]:
    """A receiver answering 500, one that accepts and never answers, two closed ports."""
    angry = Receiver(status=500)
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(16)  # connections complete, nothing is ever read or answered
    closed, closed_am = _free_port(), _free_port()
    yield {
        "notify": {"urls": [f"json://127.0.0.1:{angry.port}/{TOKEN}"], "rate_limit_seconds": 0,
                   "routes": [{"name": "slow", "urls": [f"json://127.0.0.1:{mute.getsockname()[1]}/{TOKEN}?rto=1&cto=1"],
                               "rate_limit_seconds": 0},
                              {"name": "gone", "urls": [f"json://user:{TOKEN}@127.0.0.1:{closed}/"],
                               "rate_limit_seconds": 0}]},
        "alertmanager": {"url": f"http://admin:{TOKEN}@127.0.0.1:{closed_am}", "timeout_seconds": 1},
        "grafana": {"url": "http://127.0.0.1:3000", "token": TOKEN},
        "outbox": {"retry_initial_seconds": 0.2, "retry_max_seconds": 0.5},
    }
    angry.close()
    mute.close()


def test_failed_deliveries_never_print_a_secret(tmp_path: Path, failing_targets: dict[str, Any],
                                                caplog: pytest.LogCaptureFixture) -> None:
    cfg = _write(tmp_path, failing_targets)
    out = _cli("alerts", "test", "--config", cfg)
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert lines == ["route 0 #0 (json://…): FAILED", "route slow #0 (json://…): FAILED",
                     "route gone #0 (json://…): FAILED", "route alertmanager #0 (http://…): FAILED"]
    assert TOKEN not in out.stdout + out.stderr

    caplog.set_level(logging.DEBUG)
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", run="leak", config=cfg, engine="thread")
    logging.getLogger("apprise").setLevel(logging.DEBUG)  # at DEBUG apprise prints tokens: the filter holds
    try:
        def poison(i: int) -> None:
            if i >= 4:
                model.head.weight.grad[0, 0] = float("nan")  # type: ignore[index]

        train_steps(model, opt, 8, mon, before_step=poison)
        courier = mon.engine.service.courier  # type: ignore[union-attr]
        wait_for(lambda: all(courier.counts[(r, "failed")] >= 2 for r in ("0", "slow", "gone", "alertmanager")),
                 timeout=30, what="repeated failures on every route")
        pages = []
        for path in ("/api/v1/alerts", "/", "/metrics"):
            with urllib.request.urlopen(mon.url + path, timeout=5) as r:
                pages.append(r.read().decode())
        assert "TrainingNonFinite" in pages[0]
    finally:
        mon.close()
        logging.getLogger("apprise").setLevel(logging.WARNING)
    for page in pages:
        assert TOKEN not in page
    logged = [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    assert any("route gone #0 (json://…)" in m for m in logged)
    assert any(r.name == "apprise" and r.levelno == logging.DEBUG for r in caplog.records)
    assert not [m for m in logged if TOKEN in m]
