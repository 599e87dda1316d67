"""A real Alertmanager (Debian ``prometheus-alertmanager`` on loopback, its webhook
receiver pointing at a local HTTP server) gets Sentinel's alerts through the outbox:
firing, then resolved; and an alert raised while Alertmanager is down arrives once it is back."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from sentinel.config import load_config
from sentinel.daemon.service import make_courier
from sentinel.delivery.courier import Courier, notice_of
from tests.helpers import Receiver, end_process, wait_for
from tests.integration.test_delivery import transition
from tests.integration.test_prometheus import _free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus-alertmanager") is None,
                                 reason="Debian package prometheus-alertmanager not installed")]


class Alertmanager:
    def __init__(self, tmp: Path, hook: Receiver) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cfg = tmp / "alertmanager.yml"
        self.cfg.write_text(yaml.safe_dump({
            "route": {"receiver": "hook", "group_by": ["alertname", "run"], "group_wait": "0s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [
                {"url": f"http://127.0.0.1:{hook.port}/", "send_resolved": True}]}]}))
        self.data = tmp / "am-data"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["prometheus-alertmanager", f"--config.file={self.cfg}", f"--storage.path={self.data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.ready, timeout=30, what="Alertmanager ready")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            end_process(self.proc)  # type: ignore[arg-type]
            self.proc = None

    def alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/api/v2/alerts", timeout=5) as r:
            return list(json.load(r))


@pytest.fixture
def hook() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def am(tmp_path: Path, hook: Receiver) -> Iterator[Alertmanager]:
    a = Alertmanager(tmp_path, hook)
    yield a
    a.stop()


def _courier(tmp_path: Path, am: Alertmanager) -> Courier:
    cfg, _ = load_config({"alertmanager": {"url": am.url, "resend_seconds": 0.5, "timeout_seconds": 2},
                          "outbox": {"path": str(tmp_path / "outbox.sqlite"), "retry_initial_seconds": 0.2,
                                     "retry_max_seconds": 1.0}})
    return make_courier(cfg)


def _webhooks(hook: Receiver, status: str) -> list[dict[str, Any]]:
    return [a for b in hook.bodies if b.get("status") == status for a in b.get("alerts", [])
            if a["status"] == status]


def test_alertmanager_gets_firing_then_resolved(tmp_path: Path, am: Alertmanager, hook: Receiver) -> None:
    am.start()
    c = _courier(tmp_path, am)
    try:
        began = time.time()
        c.submit(notice_of(transition(started_at=began), tags=["numerics"]))
        [firing] = wait_for(lambda: _webhooks(hook, "firing"), timeout=30, what="the firing webhook")
        assert firing["labels"] == {"alertname": "TrainingNonFinite", "severity": "critical", "job": "train",
                                    "run": "r1", "ranks": "0–3", "tags": "numerics"}
        ann = firing["annotations"]
        assert ann["summary"] == "TrainingNonFinite at step 42" and "started at step 42" in ann["description"]
        assert ann["first_checks"] == "1. lower the lr; 2. dump the batch" and ann["causes"] == "lr too high"
        wait_for(lambda: c.resend() and c.drain(5), what="a re-post while firing")
        assert [a["status"]["state"] for a in am.alerts()] == ["active"]
        c.submit(notice_of(transition(to="resolved", started_at=began), tags=["numerics"]))  # same labels
        [resolved] = wait_for(lambda: _webhooks(hook, "resolved"), timeout=30, what="the resolved webhook")
        assert resolved["labels"]["alertname"] == "TrainingNonFinite"
        ends = datetime.fromisoformat(resolved["endsAt"].replace("Z", "+00:00")).timestamp()
        assert abs(ends - (began + 5.0)) < 0.01  # the transition's time (started_at + 5 s here)
    finally:
        c.stop()


def test_an_alert_raised_during_an_alertmanager_outage_arrives_after_its_restart(
        tmp_path: Path, am: Alertmanager, hook: Receiver) -> None:
    c = _courier(tmp_path, am)  # Alertmanager is not running
    try:
        c.submit(notice_of(transition(run="outage", started_at=time.time())))
        wait_for(lambda: c.counts[("alertmanager", "failed")] >= 2, timeout=30, what="failed posts")
        assert c.outbox.depth(list(c._sinks), 0)[0] >= 1
        am.start()
        [firing] = wait_for(lambda: _webhooks(hook, "firing"), timeout=30, what="the webhook after the restart")
        assert firing["labels"]["run"] == "outage"
        wait_for(lambda: c.outbox.depth(list(c._sinks), 0)[0] == 0, what="an empty outbox")
    finally:
        c.stop()


def test_the_example_configs_critical_alert_mutes_its_runs_warnings(tmp_path: Path, hook: Receiver) -> None:
    """alerts/alertmanager.example.yml, as docs/deployment.md states it: a critical alert of a
    run mutes that run's warnings (usually its consequences), and no other run's."""
    from sentinel.delivery.sinks import AlertmanagerSink, alertmanager_alert

    example = yaml.safe_load((Path(__file__).resolve().parents[2] / "alerts" / "alertmanager.example.yml").read_text())
    am = Alertmanager(tmp_path, hook)
    cfg = yaml.safe_load(am.cfg.read_text())
    am.cfg.write_text(yaml.safe_dump({**cfg, "inhibit_rules": example["inhibit_rules"]}))
    am.start()
    try:
        now = time.time()
        notices = [{"alertname": a, "severity": s, "job": "train", "run": run, "ranks": [0, 1], "started_at": now,
                    "summary": f"{a} in {run}"}
                   for a, s, run in (("LossDivergence", "critical", "r1"), ("GradientSpike", "warning", "r1"),
                                     ("GradientSpike", "warning", "r2"))]
        assert AlertmanagerSink(am.url, "am").send({"alerts": [alertmanager_alert(n, None) for n in notices]})

        want = {("LossDivergence", "r1"): "active", ("GradientSpike", "r1"): "suppressed",
                ("GradientSpike", "r2"): "active"}
        seen: list[dict[tuple[str, str], str]] = []

        def states() -> bool:  # the inhibitor marks an alert as it is evaluated: wait for the marks
            seen.append({(a["labels"]["alertname"], a["labels"]["run"]): a["status"]["state"] for a in am.alerts()})
            return seen[-1] == want

        wait_for(states, what="the run's warning muted, the other run's not")
    finally:
        am.stop()
