"""A real Prometheus (Debian's package, on loopback) scrapes a ``sentinel run`` job."""

from __future__ import annotations

import json
import shutil
import socket
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import end_process, start_prometheus, wait_for
from tests.integration.test_run import LOG, SCRIPTS, _start

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(base: str, promql: str, at: float | None = None) -> list[dict[str, object]]:
    """An instant query, evaluated now or at the Unix time ``at``."""
    url = f"{base}/api/v1/query?query={urllib.parse.quote(promql)}" + ("" if at is None else f"&time={at}")
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
    except OSError:
        return []
    return list(body["data"]["result"]) if body.get("status") == "success" else []


def test_prometheus_scrapes_every_rank(tmp_path: Path) -> None:
    release = tmp_path / "release"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    job, url = _start([torchrun, "--standalone", "--nproc-per-node", "2",
                       str(SCRIPTS / "ddp_train.py"), "20", str(release)])
    target = url.removeprefix("http://")
    prom_port = _free_port()
    prom = start_prometheus(tmp_path, "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                            f"scrape_configs: [{{job_name: sentinel, static_configs: [{{targets: ['{target}']}}]}}]\n",
                            prom_port)
    base = f"http://127.0.0.1:{prom_port}"
    try:
        try:
            result = wait_for(lambda: (r := _query(base, "sentinel_step == 20")) and len(r) == 2 and r,
                              timeout=90, what="Prometheus to hold step 20 of both ranks")
        except BaseException:
            with urllib.request.urlopen(f"{base}/api/v1/targets", timeout=5) as r:
                targets = json.load(r)["data"]["activeTargets"]
            print("sentinel run stderr:\n" + "".join(LOG), "\ntargets:", [(t["health"], t["lastError"])
                                                                         for t in targets],
                  "\nsentinel run exit status:", job.poll())
            raise
        assert {m["metric"]["rank"] for m in result} == {"0", "1"}  # type: ignore[index]
        norms = _query(base, "sentinel_grad_norm")
        assert {m["metric"]["rank"] for m in norms} == {"0", "1"}  # type: ignore[index]
        up = _query(base, 'up{job="sentinel"}')
        assert up and up[0]["value"][1] == "1"  # type: ignore[index]
    finally:
        release.touch()
        prom.terminate()
        prom.wait(20)
        try:
            job.wait(60)
        finally:
            end_process(job)
