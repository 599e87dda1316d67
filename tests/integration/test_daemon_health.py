"""The daemon's own health series (``sentinel_daemon_*``) move as frames arrive, are refused
or are dropped, scraped from a real daemon over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sentinel import wire
from sentinel.config import load_config
from sentinel.daemon.service import Service
from tests.helpers import wait_for
from tests.integration.test_prometheus import _free_port

pytestmark = pytest.mark.integration

GROUPS = [f"layers.{i}" for i in range(4)]


def _frame(step: int, rank: int = 0) -> bytes:
    return wire.encode({"kind": "step", "job": "health", "run": "h", "rank": rank, "world": 2, "step": step,
                        "t": 1_000.0 + step, "groups": GROUPS, "grad_sumsq": [1.0 + step % 3] * len(GROUPS),
                        "scalars": {"loss": 1.0 + 0.1 * (step % 2)}, "step_seconds": 0.1, "lr": [1e-3]})


def _scrape(url: str) -> dict[str, float]:
    """Unlabelled samples only (the daemon's own series), by sample name."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.labels:
                out[s.name] = s.value
    return out


def _statm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, str]]:
    sock, port = tmp_path / "run" / "engine.sock", _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "daemon", "--socket", str(sock),
                             "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: sock.exists() and _scrape(url).get("sentinel_daemon_up") == 1.0, timeout=30,
                 what="the daemon")
        yield proc, sock, url
    finally:
        proc.terminate()
        proc.wait(20)


def test_daemon_health_moves_with_frames(daemon: tuple[subprocess.Popen[bytes], Path, str]) -> None:
    proc, sock, url = daemon
    m = _scrape(url)
    assert m["sentinel_daemon_frames_received_total"] == 0
    assert m["sentinel_daemon_frames_malformed_total"] == 0
    assert m["sentinel_daemon_rule_evaluations_total"] == 0
    assert m["sentinel_daemon_frames_dropped_total"] == 0
    assert m["sentinel_daemon_queue_depth"] == 0
    assert m["sentinel_daemon_queue_capacity"] > 0

    # RSS is the daemon's own (not this test's), and plausible for a Python process with numpy
    rss = m["sentinel_daemon_resident_memory_bytes"]
    assert 10 * 2**20 < rss < 2 * 2**30
    assert abs(rss - _statm_rss(proc.pid)) < 64 * 2**20

    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for step in range(1, 6):
        for rank in (0, 1):
            s.sendto(_frame(step, rank), str(sock))
    m = wait_for(lambda: (x := _scrape(url)).get("sentinel_daemon_frames_received_total") == 10 and x,
                 what="10 frames received")
    assert m["sentinel_daemon_frames_malformed_total"] == 0
    evaluated = m["sentinel_daemon_rule_evaluations_total"]
    assert evaluated > 0  # the rules judged the new series

    s.sendto(b"\xc1garbage", str(sock))
    s.sendto(_frame(6)[:-3], str(sock))  # truncated
    m = wait_for(lambda: (x := _scrape(url)).get("sentinel_daemon_frames_malformed_total") == 2 and x,
                 what="2 malformed frames counted")
    assert m["sentinel_daemon_frames_received_total"] == 12  # a bad frame is received, then rejected
    assert m["sentinel_daemon_rule_evaluations_total"] == evaluated  # and judged by no rule

    for step in range(6, 26):  # rules judge on their own cadence, not at every frame
        s.sendto(_frame(step), str(sock))
    m = wait_for(lambda: (x := _scrape(url)).get("sentinel_daemon_frames_received_total") == 32 and x,
                 what="20 more good frames")
    assert m["sentinel_daemon_rule_evaluations_total"] > evaluated
    assert m["sentinel_daemon_frames_dropped_total"] == 0
    assert m["sentinel_daemon_queue_depth"] == 0
    assert proc.poll() is None
    s.close()


def _refused(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return {s.labels["reason"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "sentinel_daemon_http_refused_total"}


def test_the_daemons_http_refusals_are_counted_by_reason(daemon: tuple[subprocess.Popen[bytes], Path, str]) -> None:
    _, _, url = daemon
    # every reason exists at 0 from the start, so rate() and increase() see the first one
    assert _refused(url) == {"busy": 0, "timeout": 0, "host": 0, "cert": 0, "auth": 0}
    port = int(url.rsplit(":", 1)[1])
    for _ in range(2):  # a web page's request through a rebound DNS name: a 403
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"GET /api/v1/alerts HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n")
            assert c.recv(64).startswith(b"HTTP/1.1 403 ")
    assert _refused(url) == {"busy": 0, "timeout": 0, "host": 2, "cert": 0, "auth": 0}


def test_queue_depth_and_drops_when_the_engine_falls_behind() -> None:
    config, pack = load_config({"gpu": {"enabled": False}})
    service = Service(config, pack, "127.0.0.1:0", queue_size=4)
    try:
        with service.engine._lock:  # the worker blocks on its first frame: the engine "falls behind"
            assert service.submit(_frame(1))
            wait_for(lambda: service._taken == 1, what="the worker to take the first frame")
            results = [service.submit(_frame(step)) for step in range(2, 11)]
            assert results == [True] * 4 + [False] * 5  # the queue holds 4; the other 5 are dropped
            m = _scrape(service.url)
            assert m["sentinel_daemon_queue_capacity"] == 4
            assert m["sentinel_daemon_queue_depth"] == 4
            assert m["sentinel_daemon_frames_dropped_total"] == 5
            assert m["sentinel_daemon_frames_received_total"] == 0
        assert service.flush()
        m = _scrape(service.url)
        assert m["sentinel_daemon_queue_depth"] == 0
        assert m["sentinel_daemon_frames_received_total"] == 5
        assert m["sentinel_daemon_frames_dropped_total"] == 5
        assert m["sentinel_daemon_rule_evaluations_total"] > 0
    finally:
        service.stop()
