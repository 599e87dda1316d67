"""Routes, cooldowns, rate limits and the outbox, against real receivers through apprise
``json://`` and a real SQLite file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sentinel.config import load_config
from sentinel.daemon.service import make_courier
from sentinel.delivery.courier import Courier, notice_of
from sentinel.rules.alert import Transition
from tests.helpers import Receiver, wait_for
from tests.integration.test_prometheus import _free_port

pytestmark = pytest.mark.integration


def transition(name: str = "TrainingNonFinite", severity: str = "critical", to: str = "firing",
               run: str = "r1", started_at: float = 1000.0, step: int = 42) -> Transition:
    return Transition(name, severity, "inactive" if to == "firing" else "firing", to, "train", run, (0, 1, 2, 3),
                      ("layers.1",), step + 7, started_at + (5.0 if to == "resolved" else 0.0), float("nan"), 0.0,
                      f"{name} at step {step}", ("lr too high",), ("lower the lr", "dump the batch"), "look",
                      started_step=step, started_at=started_at)


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    rs = [Receiver(), Receiver()]
    yield rs
    for r in rs:
        r.close()


def courier(tmp_path: Path, notify: dict[str, Any], **outbox: Any) -> Courier:
    outbox.setdefault("path", str(tmp_path / "outbox.sqlite"))
    outbox.setdefault("retry_initial_seconds", 0.1)
    outbox.setdefault("retry_max_seconds", 0.5)
    cfg, _ = load_config({"notify": notify, "outbox": outbox})
    return make_courier(cfg)


def titles(r: Receiver) -> list[str]:
    return [b["title"] for b in r.bodies]


def test_routes_filter_by_severity_and_alert_name(tmp_path: Path, receivers: list[Receiver]) -> None:
    pager, chat = receivers
    c = courier(tmp_path, {"routes": [
        {"name": "pager", "urls": [pager.url], "severities": ["critical"], "rate_limit_seconds": 0},
        {"name": "chat", "urls": [chat.url], "alertnames": ["LossSpike"], "min_severity": "info",
         "rate_limit_seconds": 0},
    ]})
    try:
        c.submit(notice_of(transition("TrainingNonFinite", "critical")))
        c.submit(notice_of(transition("LossSpike", "warning")))
        c.submit(notice_of(transition("GradientSpike", "warning")))
        assert c.drain(10)
        assert [t.split()[2] for t in titles(pager)] == ["TrainingNonFinite"]
        assert [t.split()[2] for t in titles(chat)] == ["LossSpike"]
        assert c.counts[("pager", "sent")] == 1 and c.counts[("chat", "sent")] == 1
    finally:
        c.stop()


def test_cooldown_collapses_a_burst_and_resolved_follows_firing(tmp_path: Path, receivers: list[Receiver]) -> None:
    r = receivers[0]
    c = courier(tmp_path, {"urls": [r.url], "cooldown_seconds": 3600, "rate_limit_seconds": 0})
    try:
        for i in range(5):  # a flapping alert: fires and resolves five times
            c.submit(notice_of(transition(started_at=1000.0 + 10 * i)))
            c.submit(notice_of(transition(to="resolved", started_at=1000.0 + 10 * i)))
        assert c.drain(10)
        assert [t.split()[0] for t in titles(r)] == ["[FIRING]", "[RESOLVED]"]
        assert "after firing for 5 s" in r.bodies[1]["message"]
        assert c.counts[("0", "suppressed")] == 8 and c.counts[("0", "sent")] == 2
    finally:
        c.stop()


def test_rate_limit_spaces_messages(tmp_path: Path, receivers: list[Receiver]) -> None:
    r = receivers[0]
    c = courier(tmp_path, {"urls": [r.url], "rate_limit_seconds": 0.3})
    try:
        for i in range(4):
            c.submit(notice_of(transition(run=f"run{i}")))
        assert c.drain(10)
        wait_for(lambda: len(r.bodies) == 4, what="four messages")
        gaps = [b - a for a, b in zip(r.arrivals, r.arrivals[1:])]
        assert min(gaps) >= 0.29, gaps  # the route's limit, enforced by the courier
        assert sorted(b["title"].split("run ")[1].split(",")[0] for b in r.bodies) == ["run0", "run1", "run2", "run3"]
    finally:
        c.stop()


def test_receiver_down_then_back_delivers_every_alert_exactly_once(tmp_path: Path) -> None:
    port = _free_port()  # nothing listens yet: connections are refused
    c = courier(tmp_path, {"urls": [f"json://127.0.0.1:{port}/"], "rate_limit_seconds": 0})
    r: Receiver | None = None
    try:
        for i in range(6):
            c.submit(notice_of(transition(run=f"run{i}")))
        wait_for(lambda: c.counts[("0", "failed")] >= 6, what="failed first attempts")
        r = Receiver(port=port, status=500)  # back, but failing
        wait_for(lambda: r is not None and r.refused >= 3, what="attempts answered 500")
        r.status = 200
        wait_for(lambda: r is not None and len(r.bodies) >= 6 and c.outbox.depth(list(c._sinks), 0)[0] == 0,
                 timeout=20, what="every alert delivered")
        ids = [b["message"].rsplit("id: ", 1)[1] for b in r.bodies]
        assert len(ids) == len(set(ids)) == 6  # none lost, none twice
        with sqlite3.connect(c.outbox.path) as db:  # the real file says so too
            assert db.execute("SELECT state, COUNT(*) FROM outbox GROUP BY state").fetchall() == [("sent", 6)]
        assert c.counts[("0", "sent")] == 6
    finally:
        c.stop()
        if r is not None:
            r.close()


def test_an_unwritable_outbox_degrades_to_memory(tmp_path: Path, receivers: list[Receiver],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # a file where the outbox's folder should be: no one, root included, can write there
    r = receivers[0]
    c = courier(tmp_path, {"urls": [r.url]}, path=str(blocker / "outbox.sqlite"))
    try:
        c.submit(notice_of(transition()))
        assert c.drain(10)
        assert len(r.bodies) == 1
        rows = {name: v for name, _, _, v in c.rows()}
        assert rows["sentinel_outbox_degraded_total"] == 1.0 and rows["sentinel_outbox_durable"] == 0.0
        assert any("delivering from memory" in m for m in caplog.messages)
    finally:
        c.stop()


def test_grafana_annotations_go_through_the_outbox(tmp_path: Path) -> None:
    """No Grafana server can run on these machines: a local HTTP server stands in for it
    and records what Grafana's ``POST /api/annotations`` receives."""
    grafana = Receiver(status=503)  # down at first
    cfg, _ = load_config({"grafana": {"url": f"http://127.0.0.1:{grafana.port}", "token": "glsa_TESTTOKEN"},
                          "outbox": {"path": str(tmp_path / "outbox.sqlite"), "retry_initial_seconds": 0.1,
                                     "retry_max_seconds": 0.3}})
    c = make_courier(cfg)
    try:
        c.submit(notice_of(transition()))
        wait_for(lambda: grafana.refused >= 1, timeout=10, what="a first attempt while Grafana is down")
        grafana.status = 200
        c.submit(notice_of(transition(to="resolved")))
        wait_for(lambda: len(grafana.bodies) == 2, timeout=20, what="both annotations")
        assert c.drain(5) and c.counts[("grafana", "sent")] == 2
    finally:
        c.stop()
        grafana.close()
    assert grafana.requests == [("/api/annotations", "Bearer glsa_TESTTOKEN")] * 2
    by_state = {next(t for t in b["tags"] if t.startswith("state:")): b for b in grafana.bodies}
    firing, resolved = by_state["state:firing"], by_state["state:resolved"]
    for b in (firing, resolved):
        assert {"sentinel", "alertname:TrainingNonFinite", "severity:critical", "run:r1"} <= set(b["tags"])
        assert b["time"] == 1_000_000  # when the alert began, in ms
        assert "/d/sentinel-layers?" in b["text"]  # a NaN opens the per-layer dashboard
    assert firing["timeEnd"] == firing["time"] and resolved["timeEnd"] == 1_005_000  # a region once resolved

