"""Sinks: send one stored notification, return a bool, never raise.

- :class:`AppriseSink`: one apprise URL (chat, pager, ``json://`` …).
- :class:`AlertmanagerSink`: Alertmanager's v2 API, ``POST /api/v2/alerts``.
- :class:`GrafanaSink`: an annotation per transition, ``POST /api/annotations``.

Failures are logged by route, URL index and scheme only.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sentinel.delivery.secrets import describe, load_url

log = logging.getLogger("sentinel")


class AppriseSink:
    """Sends title and body to one apprise URL.

    Args:
        url: the apprise URL (a secret; kept only inside the plugin object).
        name: how logs name it, e.g. ``route 0 #1 (slack://…)``.
    """

    def __init__(self, url: str, name: str) -> None:
        self.name = name
        self._plugin = load_url(url)
        native = getattr(self._plugin, "notify_format", None)  # a format, or preferred-first tuple
        first = native[0] if isinstance(native, (tuple, list)) and native else native
        self.markdown = str(getattr(first, "value", first)).lower() in ("markdown", "html")

    def send(self, payload: Mapping[str, Any]) -> bool:
        if self._plugin is None:
            return False
        import apprise

        fmt = apprise.NotifyFormat.MARKDOWN if payload.get("markdown") else apprise.NotifyFormat.TEXT
        ap = apprise.Apprise()
        ap.add(self._plugin)
        try:
            return bool(ap.notify(title=str(payload.get("title", "")), body=str(payload.get("body", "")),
                                  notify_type=str(payload.get("notify_type", "info")), body_format=fmt))
        except Exception as exc:  # plugins may raise despite the contract
            log.warning("sentinel notify: %s raised %s", self.name, type(exc).__name__)
            return False


def alertmanager_alert(n: Mapping[str, Any], resolved_at: float | None) -> dict[str, Any]:
    """One Alertmanager v2 alert for a notice; ``endsAt`` set when it resolved."""
    from datetime import datetime, timezone

    from sentinel.rules.alert import compact_ranks

    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")

    labels = {"alertname": str(n.get("alertname")), "severity": str(n.get("severity")),
              "job": str(n.get("job")), "run": str(n.get("run")),
              "ranks": compact_ranks(list(n.get("ranks") or [])).split(" ", 1)[-1]}
    if n.get("optimizers"):  # the optimizer streams of a process with several (a GAN's)
        labels["optimizer"] = ",".join(str(o) for o in n["optimizers"])
    if n.get("tags"):
        labels["tags"] = ",".join(sorted(str(t) for t in n["tags"]))
    for k, v in dict(n.get("labels") or {}).items():  # where the run runs, e.g. slurm_job, slurm_node
        labels.setdefault(str(k), str(v))
    ann = {"summary": str(n.get("summary", "")),
           "description": f"started at step {n.get('started_step')}; value {n.get('value')} "
                          f"against threshold {n.get('threshold')}; host {n.get('host')}, pid {n.get('pid')}",
           "causes": "; ".join(n.get("causes") or []),
           "first_checks": "; ".join(f"{i}. {c}" for i, c in enumerate(n.get("checks") or [], 1)),
           "runbook": str(n.get("runbook") or "").strip()}
    if n.get("grafana"):
        ann["dashboard"] = str(n["grafana"])
    if n.get("evidence"):  # actions.capture_on: where the evidence and the batch were saved
        ann["evidence"] = str(n["evidence"])
        ann["batch"] = ", ".join(str(p) for p in list(n.get("inputs") or [])[:8])
    alert: dict[str, Any] = {"labels": labels, "annotations": {k: v for k, v in ann.items() if v},
                             "startsAt": iso(float(n.get("started_at") or n.get("time") or 0.0))}
    if resolved_at is not None:
        alert["endsAt"] = iso(resolved_at)
    return alert


def _post_json(endpoint: str, body: Any, label: str, timeout: float, auth: str | None) -> bool:
    req = urllib.request.Request(endpoint, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if auth:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except urllib.error.HTTPError as exc:
        log.warning("sentinel notify: %s answered HTTP %d", label, exc.code)
    except (OSError, ValueError) as exc:
        log.warning("sentinel notify: %s unreachable (%s)", label, type(exc).__name__)
    return False


class GrafanaSink:
    """Posts one annotation (``payload["annotation"]``) to ``<url>/api/annotations`` with a
    service-account token, so the dashboards' "Sentinel events" query shows the alert."""

    def __init__(self, url: str, token: str, name: str = "grafana", timeout: float = 5.0) -> None:
        self.name = name
        self.timeout = timeout
        self._endpoint = url.rstrip("/") + "/api/annotations"
        self._auth = f"Bearer {token}" if token else None
        self._label = describe("grafana", url)

    def send(self, payload: Mapping[str, Any]) -> bool:
        return _post_json(self._endpoint, payload.get("annotation", {}), self._label, self.timeout, self._auth)


class AlertmanagerSink:
    """Posts alerts to ``<url>/api/v2/alerts``; credentials in the URL become basic auth."""

    def __init__(self, url: str, name: str = "alertmanager", timeout: float = 5.0) -> None:
        self.name = name
        self.timeout = timeout
        parts = urlsplit(url)
        self._auth: str | None = None
        if parts.username is not None:
            cred = f"{parts.username}:{parts.password or ''}".encode()
            self._auth = "Basic " + base64.b64encode(cred).decode()
            parts = parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else ""))
        self._endpoint = urlunsplit(parts).rstrip("/") + "/api/v2/alerts"
        self._label = describe("alertmanager", url)

    def send(self, payload: Mapping[str, Any]) -> bool:
        return _post_json(self._endpoint, list(payload.get("alerts", [])), self._label, self.timeout, self._auth)
