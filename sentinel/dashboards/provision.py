"""``sentinel dashboards provision``: upsert the dashboards into a Grafana over its HTTP API
(grafana-client), idempotently.

What it does, in order: checks the Grafana (reachable, version, token), creates the folder
if it is missing, creates or updates the Prometheus datasource when a Prometheus URL is
given, and upserts every dashboard by uid with ``overwrite``. A dashboard whose stored JSON
(less ``id`` and ``version``) and folder already match is left alone, so a second run
changes nothing and says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MIN_VERSION = (11, 0)
"""Oldest Grafana the generated JSON (the 11.6 flavour's schema) is provisioned into."""
DATASOURCE_UID = "sentinel-prometheus"
"""The Prometheus datasource provisioning makes (``--prometheus-url``, and
``dashboards/provisioning/datasources.yaml``); the dashboards open on it."""
DATASOURCE_NAME = "Sentinel Prometheus"
FOLDER_UID = "sentinel"


class ProvisionError(Exception):
    """One line for the user; never holds the token."""


@dataclass
class Report:
    """What a run did, by object: ``created``, ``updated`` or ``unchanged``."""

    grafana_version: str = ""
    actions: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return any(a != "unchanged" for a in self.actions.values())

    def lines(self) -> list[str]:
        out = [f"{what}: {action}" for what, action in self.actions.items()]
        if not self.changed:
            out.append(f"nothing changed: Grafana {self.grafana_version} already holds all "
                       f"{len(self.actions)} objects as they are")
        else:
            n = sum(a != "unchanged" for a in self.actions.values())
            out.append(f"done: {n} of {len(self.actions)} objects created or updated in Grafana "
                       f"{self.grafana_version}")
        return out


def redact(url: str) -> str:
    """A URL without its user and password (errors may name the Grafana, never a secret)."""
    return re.sub(r"//[^/@]*@", "//", url)


def _version(text: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _strip(dashboard: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in dashboard.items() if k not in ("id", "version")}


def provision(url: str, token: str | None, dashboards: Mapping[str, Mapping[str, Any]], *,
              folder: str = "Sentinel", prometheus_url: str | None = None, timeout: float = 10.0,
              api: Any = None) -> Report:
    """Upsert ``dashboards`` (file stem → dashboard JSON) into the Grafana at ``url``.

    Args:
        url: the Grafana's base URL.
        token: a service-account token (Bearer), or None for credentials in the URL.
        dashboards: what :func:`sentinel.dashboards.build` returns.
        folder: the folder title (its uid is ``sentinel``).
        prometheus_url: when given, the Prometheus datasource ``sentinel-prometheus`` is
            created or updated to point there.
        timeout: seconds per request.
        api: a ``grafana_client.GrafanaApi`` (built from ``url`` and ``token`` by default).

    Returns:
        What was created, updated or left unchanged.

    Raises:
        ProvisionError: Grafana is unreachable, refuses the token, is too old, or rejects
            an object; the message is one line and never contains the token.
    """
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaUnauthorizedError

    where = redact(url)
    if api is None:
        api = GrafanaApi.from_url(url, credential=token, timeout=timeout)
    report = Report()
    try:
        health = api.client.GET("/health")
        report.grafana_version = str(health.get("version", "")) if isinstance(health, dict) else ""
        if _version(report.grafana_version) < MIN_VERSION:
            raise ProvisionError(f"Grafana at {where} is version {report.grafana_version or 'unknown'}; "
                                 f"the dashboards need {MIN_VERSION[0]}.{MIN_VERSION[1]} or newer")
        _folder(api, folder, report, GrafanaClientError)
        if prometheus_url:
            _datasource(api, prometheus_url, report, GrafanaClientError)
        for stem, doc in dashboards.items():
            _dashboard(api, stem, doc, report, GrafanaClientError)
    except ProvisionError:
        raise
    except GrafanaUnauthorizedError:
        raise ProvisionError(f"Grafana at {where} refused the token (HTTP 401): check it, and that it "
                             "belongs to a service account with the Editor role") from None
    except GrafanaException as exc:
        code = getattr(exc, "status_code", 0)
        if code == 403:
            raise ProvisionError(f"Grafana at {where} forbids this (HTTP 403): the token needs the Editor "
                                 "role (Admin to create the datasource)") from None
        if code:
            raise ProvisionError(f"Grafana at {where} answered HTTP {code}: {_short(exc)}") from None
        raise ProvisionError(f"cannot reach Grafana at {where}: {_short(exc)}") from None
    except Exception as exc:  # niquests' connection errors and the like: one line, no traceback
        raise ProvisionError(f"cannot reach Grafana at {where}: {type(exc).__name__}") from None
    return report


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "message", "") or exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:160]


def _folder(api: Any, title: str, report: Report, not_found: type[Exception]) -> None:
    try:
        current = api.folder.get_folder(FOLDER_UID)
    except not_found as exc:
        if getattr(exc, "status_code", 0) != 404:
            raise
        api.folder.create_folder(title, uid=FOLDER_UID)
        report.actions[f"folder {title!r}"] = "created"
        return
    if current.get("title") != title:
        api.folder.update_folder(FOLDER_UID, title=title, overwrite=True)
        report.actions[f"folder {title!r}"] = "updated"
    else:
        report.actions[f"folder {title!r}"] = "unchanged"


def _datasource(api: Any, prometheus_url: str, report: Report, not_found: type[Exception]) -> None:
    want = {"uid": DATASOURCE_UID, "name": DATASOURCE_NAME, "type": "prometheus", "access": "proxy",
            "url": prometheus_url, "jsonData": {"httpMethod": "POST", "timeInterval": "15s"}}
    label = f"datasource {DATASOURCE_UID}"
    try:
        current = api.datasource.get_datasource_by_uid(DATASOURCE_UID)
    except not_found as exc:
        if getattr(exc, "status_code", 0) != 404:
            raise
        api.datasource.create_datasource(want)
        report.actions[label] = "created"
        return
    if all(current.get(k) == v for k, v in want.items()):
        report.actions[label] = "unchanged"
    else:
        api.datasource.update_datasource_by_uid(DATASOURCE_UID, want)
        report.actions[label] = "updated"


def _dashboard(api: Any, stem: str, doc: Mapping[str, Any], report: Report, not_found: type[Exception]) -> None:
    uid = str(doc["uid"])
    label = f"dashboard {uid}"
    action = "created"
    try:
        current = api.dashboard.get_dashboard(uid)
    except not_found as exc:
        if getattr(exc, "status_code", 0) != 404:
            raise
    else:
        same_folder = current.get("meta", {}).get("folderUid") == FOLDER_UID
        if same_folder and _strip(current.get("dashboard", {})) == _strip(doc):
            report.actions[label] = "unchanged"
            return
        action = "updated"
    api.dashboard.update_dashboard({"dashboard": {**_strip(doc), "id": None}, "folderUid": FOLDER_UID,
                                    "overwrite": True, "message": f"sentinel dashboards provision ({stem})"})
    report.actions[label] = action
