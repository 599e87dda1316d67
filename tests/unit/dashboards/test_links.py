"""The dashboard link an alert message carries, and the annotation payload a sink posts."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

from sentinel.dashboards.links import annotation, dashboard_link

ALERT = {"alertname": "LossSpike", "severity": "warning", "state": "firing", "job": "train", "run": "exp 42",
         "summary": "Loss spiked to 9.1", "started_at": 1700000000.0, "resolved_at": None}


@pytest.mark.parametrize(("alert", "uid", "has_run"), [
    (ALERT, "sentinel-overview", True),
    ({**ALERT, "alertname": "TrainingNonFinite"}, "sentinel-layers", True),
    ({**ALERT, "alertname": "OOMRisk"}, "sentinel-optimizer-memory", True),
    ({**ALERT, "alertname": "GPUXidError", "job": "node", "run": "node-7"}, "sentinel-ranks-gpus", False),
])
def test_link_opens_the_right_dashboard_run_and_time(alert: dict, uid: str, has_run: bool) -> None:  # type: ignore[type-arg]
    url = urlparse(dashboard_link("https://grafana.example.com/g/", alert))
    assert url.path == f"/g/d/{uid}"
    q = parse_qs(url.query)
    assert (q.get("var-run"), q.get("var-job")) == ((["exp 42"], ["train"]) if has_run else (None, None))
    assert int(q["from"][0]) == 1700000000000 - 900_000 and int(q["to"][0]) == 1700000000000 + 300_000


def test_a_resolved_alert_links_until_it_resolved() -> None:
    q = parse_qs(urlparse(dashboard_link("http://g", {**ALERT, "resolved_at": 1700003600.0})).query)
    assert int(q["to"][0]) == 1700003600000 + 300_000


def test_annotation_shape() -> None:
    fired = annotation(ALERT, base_url="http://g", dashboard="sentinel-overview")
    assert fired["time"] == fired["timeEnd"] == 1700000000000
    assert fired["tags"] == ["sentinel", "alertname:LossSpike", "severity:warning", "run:exp 42", "state:firing"]
    assert "Loss spiked to 9.1" in fired["text"] and "http://g/d/sentinel-overview?" in fired["text"]
    assert fired["dashboardUID"] == "sentinel-overview"
    resolved = annotation({**ALERT, "state": "resolved", "resolved_at": 1700000060.5})
    assert (resolved["time"], resolved["timeEnd"]) == (1700000000000, 1700000060500)
    assert "dashboardUID" not in resolved and "state:resolved" in resolved["tags"]
