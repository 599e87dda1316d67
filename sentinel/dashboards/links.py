"""Where an alert points in Grafana: the dashboard link for a message, and the annotation a
Grafana sink posts (``POST /api/annotations``). Pure functions of an alert's fields, with no
I/O and no SDK, so a sink in ``sentinel/delivery/`` is a few lines around them.

An alert here is the mapping ``/api/v1/alerts`` serves (and a transition's ``to_json()``):
``alertname``, ``severity``, ``state``, ``job``, ``run``, ``ranks``, ``summary``,
``started_at`` and ``resolved_at`` (Unix seconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

DASHBOARD_OF: dict[str, str] = {
    "TrainingNonFinite": "sentinel-layers",  # it names the first non-finite groups
    "GradientVanishing": "sentinel-layers",
    "OptimizerStateSaturated": "sentinel-optimizer-memory",
    "OOMRisk": "sentinel-optimizer-memory",
    "LossScaleCollapse": "sentinel-optimizer-memory",
    "RankDivergence": "sentinel-ranks-gpus",
    "RankStraggler": "sentinel-ranks-gpus",
    "TrainingStalled": "sentinel-ranks-gpus",
    "GPUOverheating": "sentinel-ranks-gpus",
    "GPUXidError": "sentinel-ranks-gpus",
    "GPUEccErrors": "sentinel-ranks-gpus",
}
"""The dashboard that answers an alert first; any other alert opens the overview."""
OVERVIEW = "sentinel-overview"
NODE_JOB = "node"  # GPU alerts: job "node", run = the host name (no training run to select)
BEFORE_SECONDS = 900.0
AFTER_SECONDS = 300.0


def dashboard_uid(alertname: str) -> str:
    return DASHBOARD_OF.get(alertname, OVERVIEW)


def dashboard_link(base_url: str, alert: Mapping[str, Any], *, before: float = BEFORE_SECONDS,
                   after: float = AFTER_SECONDS, org_id: int = 1, uid: str = "") -> str:
    """The URL of the dashboard for ``alert``, its run selected, around its time.

    Args:
        base_url: Grafana's root URL, e.g. ``https://grafana.example.com`` (a path prefix is kept).
        alert: the alert's fields (see the module docstring).
        before, after: seconds shown before it started and after it resolved (or after
            it started, while it fires).
        org_id: the Grafana organisation.
        uid: a dashboard to link instead of the one that answers the alert first.

    Returns:
        ``<base>/d/<uid>?orgId=..&var-job=..&var-run=..&from=<ms>&to=<ms>``; GPU alerts
        select no run (their ``run`` is the host name).
    """
    started = float(alert.get("started_at") or 0.0)
    ended = alert.get("resolved_at")
    end = float(ended) if ended else started
    query: list[tuple[str, str]] = [("orgId", str(org_id))]
    if alert.get("job") != NODE_JOB:
        query += [("var-job", str(alert.get("job", ""))), ("var-run", str(alert.get("run", "")))]
    query += [("from", str(_ms(started - before))), ("to", str(_ms(end + after)))]
    uid = uid or dashboard_uid(str(alert.get("alertname", "")))
    return f"{base_url.rstrip('/')}/d/{uid}?{urlencode(query)}"


def tags(alert: Mapping[str, Any]) -> list[str]:
    """``sentinel`` plus ``alertname:``, ``severity:`` and ``run:`` tags (what the
    dashboards' "Sentinel events" annotation query and Grafana's tag filter match)."""
    return ["sentinel", f"alertname:{alert.get('alertname', '')}", f"severity:{alert.get('severity', '')}",
            f"run:{alert.get('run', '')}"]


def annotation(alert: Mapping[str, Any], *, base_url: str | None = None,
               dashboard: str | None = None) -> dict[str, Any]:
    """The body of ``POST /api/annotations`` for an alert's transition.

    A firing alert is a point at ``started_at``; a resolved one a region from
    ``started_at`` to ``resolved_at`` (``time``/``timeEnd`` in epoch milliseconds). Without
    ``dashboard`` the annotation is organisation-wide and every Sentinel dashboard shows
    it through its tag query.

    Args:
        alert: the alert's fields.
        base_url: when given, the text carries the dashboard link.
        dashboard: pin the annotation to this dashboard uid.
    """
    started = _ms(float(alert.get("started_at") or 0.0))
    resolved = alert.get("resolved_at")
    state = str(alert.get("state", "firing"))
    body: dict[str, Any] = {"time": started, "tags": tags(alert) + [f"state:{state}"]}
    if state == "resolved" and resolved:
        body["timeEnd"] = _ms(float(resolved))
    else:
        body["timeEnd"] = started
    text = f"{alert.get('alertname', '')} {state} ({alert.get('severity', '')}): {alert.get('summary', '')}"
    if base_url:
        text += f'\n<a href="{dashboard_link(base_url, alert)}">open in Grafana</a>'
    body["text"] = text
    if dashboard:
        body["dashboardUID"] = dashboard
    return body


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))
