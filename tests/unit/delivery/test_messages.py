"""Message text: what the on-call engineer reads first."""

from __future__ import annotations

import math

from sentinel.dashboards.links import dashboard_link
from sentinel.delivery.courier import notice_of
from sentinel.delivery.messages import body, sparkline, title
from sentinel.rules.alert import Transition


def _t(to: str = "firing") -> Transition:
    return Transition("GradientSpike", "warning", "inactive", to, "train", "r7", (0, 1, 2, 3, 5), ("layers.3",),
                      480, 1000.0 + (754.0 if to == "resolved" else 0.0), 50.0, 10.0, "Gradient norm jumped",
                      ("hard samples",), ("check the batch", "clip"), "see the runbook", started_step=200,
                      started_at=1000.0)


def test_firing_message_names_the_start_value_threshold_where_and_first_checks() -> None:
    n = notice_of(_t(), recent=[1.0, 1.1, 0.9, 1.0, 50.0, math.nan], metric="sentinel_grad_norm",
                  grafana=dashboard_link("https://g.example", _t().to_json()))
    assert title(n) == "[FIRING] warning GradientSpike — run r7, since step 200"
    text = body(n)
    for needle in ("value: 50 against threshold 10", "where: ranks 0–3, 5, groups layers.3",
                   "started at step: 200, latest step 480", "recent sentinel_grad_norm: ▁▁▁▁█✗",
                   "likely causes:\n- hard samples", "first checks:\n1. check the batch\n2. clip",
                   "runbook: see the runbook", f"host {n['host']}, pid {n['pid']}",
                   "grafana: https://g.example/d/sentinel-overview?orgId=1&var-job=train&var-run=r7&from=100000&to=1300000",
                   f"id: {n['key']}"):
        assert needle in text, needle
    md = body(n, markdown=True)
    assert "**first checks**:" in md and "`▁▁▁▁█✗`" in md and "[Grafana dashboard](https://g.example/d/" in md


def test_resolved_message_says_how_long_it_fired() -> None:
    n = notice_of(_t("resolved"))
    assert title(n).startswith("[RESOLVED] warning GradientSpike")
    assert "resolved after firing for 12 min 34 s (from step 200 to step 480)" in body(n)
    assert "first checks" not in body(n)


def test_an_alert_that_ended_with_its_run_is_not_called_resolved() -> None:
    t = _t("resolved")
    n = notice_of(Transition(**{**vars(t), "ended": True}))
    assert title(n) == "[ENDED] warning GradientSpike — run r7, since step 200"
    text = body(n)
    assert "ended with its ranks while it fired for 12 min 34 s (from step 200 to step 480)" in text
    assert "nothing recovered" in text and "resolved after" not in text


def test_sparkline_scales_to_the_range() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([3, 3, 3]) == "▁▁▁" and sparkline([]) == ""
