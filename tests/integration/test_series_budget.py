"""docs/deployment.md, "The series budget": a node's daemon with 8 ranks of a 64-group model
exports at most 2,000 series in the ``fleet`` profile, and every rank keeps its own series.

Real parts: the frames of a real CPU run recorded by the monitor itself (the benchmark's
recording: a residual MLP of 64 groups, AdamW, 300 steps), replayed as the 8
ranks of a DDP job into a real ``sentinel daemon`` over its socket, counted in what a scrape
of its ``/metrics`` returns (the daemon's own series included).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.series_budget import record
from sentinel import wire
from tests.helpers import wait_for, write_config
from tests.integration.test_prometheus import _free_port

pytestmark = pytest.mark.integration

RANKS, GROUPS = 8, 64


def _frames() -> list[dict[str, Any]]:
    """The benchmark's own recording: the frames its table was measured with."""
    frames, groups = record(GROUPS)
    assert groups == GROUPS
    return frames


def _series(frames: list[dict[str, Any]], tmp_path: Path, profile: str) -> tuple[int, set[str]]:
    """Series in one scrape of a daemon fed the frames as RANKS ranks; the ranks seen."""
    sock, port = tmp_path / profile / "engine.sock", _free_port()
    cfg = write_config(tmp_path, profile=profile)
    proc = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "daemon", "--socket", str(sock), "--config", cfg,
                             "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for(sock.exists, timeout=30, what="the daemon's socket")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        now = time.time()
        for f in frames:
            for r in range(RANKS):
                s.sendto(wire.encode(dict(f, rank=r, world=RANKS, t=now)), str(sock))
            time.sleep(0.001)  # a step's frames, then the next: the queue never overflows
        s.close()

        def scrape() -> str | None:
            with urllib.request.urlopen(url, timeout=10) as reply:
                text = reply.read().decode()
            counts = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                      if not s.labels}
            return text if counts.get("sentinel_daemon_frames_received_total") == len(frames) * RANKS else None

        text = wait_for(scrape, timeout=60, what="every frame ingested")
    finally:
        proc.terminate()
        proc.wait(20)
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    assert not [s for s in samples if s.name == "sentinel_alert_firing" and s.value and "group" in s.labels]
    return len(samples), {s.labels["rank"] for s in samples if s.name == "sentinel_step"}


def test_a_node_of_8_ranks_of_64_groups_stays_within_2000_series_in_the_fleet_profile(tmp_path: Path) -> None:
    frames = _frames()
    fleet, fleet_ranks = _series(frames, tmp_path, "fleet")
    full, full_ranks = _series(frames, tmp_path, "full")
    assert fleet <= 2000, fleet  # the stated budget
    assert fleet_ranks == full_ranks == {str(r) for r in range(RANKS)}  # every rank's own series stay
    # full: about 41 series a rank plus 5 a group a rank (docs/deployment.md's table: 2,892)
    assert RANKS * (5 * GROUPS) < full < RANKS * (60 + 5 * GROUPS) + 200, full
    assert full - fleet > (RANKS - 1) * 4 * GROUPS  # the per-group series of 7 ranks are what fleet leaves out
