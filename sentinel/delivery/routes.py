"""Routes: which alerts go where, and how often.

A :class:`Route` matches a notice on severity, alert name, tags, run and job, and keeps a
cooldown per alert key ``(alertname, job, run)``: a firing for a key that had a message
less than ``cooldown_seconds`` ago is suppressed, and so is the resolve of a suppressed
firing. The rate limit (one message per ``rate_limit_seconds``) is applied when sending:
messages wait their turn, none is dropped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SEVERITY_ORDER = {"info": 0, "warning": 1, "critical": 2}


@dataclass
class Route:
    """One route. ``sink`` is ``apprise``, ``alertmanager`` or ``grafana``; ``secrets``
    are its URLs (for ``grafana``, with its token in ``token``)."""

    label: str
    sink: str
    secrets: tuple[str, ...]
    min_severity: str = "warning"
    severities: tuple[str, ...] = ()
    alertnames: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    runs: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()
    cooldown_seconds: float = 0.0
    rate_limit_seconds: float = 0.0
    resolved: bool = True
    format: str = "auto"
    token: str = ""
    _last_sent: dict[tuple[str, str, str], float] = field(default_factory=dict)
    _suppressed: set[tuple[str, str, str]] = field(default_factory=set)

    def target(self, index: int) -> str:
        """A stable id of where URL ``index`` delivers (a hash: the URL never leaves
        memory). Outbox rows carry it, so a restarted daemon with the same URL picks them
        up, and one URL's retry never resends to another that succeeded."""
        return hashlib.sha256(f"{self.sink}\0{self.secrets[index]}\0{self.token}".encode()).hexdigest()[:24]

    def matches(self, n: Mapping[str, Any]) -> bool:
        """Whether the route takes this notice (ignoring cooldowns)."""
        sev = str(n.get("severity", "info"))
        if self.severities:
            if sev not in self.severities:
                return False
        elif SEVERITY_ORDER.get(sev, 0) < SEVERITY_ORDER.get(self.min_severity, 0):
            return False
        if self.alertnames and n.get("alertname") not in self.alertnames:
            return False
        if self.tags and not set(self.tags) & set(n.get("tags") or ()):
            return False
        if self.runs and n.get("run") not in self.runs:
            return False
        if self.jobs and n.get("job") not in self.jobs:
            return False
        return not (n.get("state_to") == "resolved" and not self.resolved)

    def admit(self, n: Mapping[str, Any], now: float) -> bool:
        """Apply the cooldown: False when this notice is suppressed. Call once per notice
        that :meth:`matches`."""
        key = (str(n.get("alertname")), str(n.get("job")), str(n.get("run")))
        if n.get("state_to") == "resolved":
            if key in self._suppressed:
                self._suppressed.discard(key)
                return False
            return True
        last = self._last_sent.get(key)
        if self.cooldown_seconds > 0 and last is not None and now - last < self.cooldown_seconds:
            self._suppressed.add(key)
            return False
        self._last_sent[key] = now
        if len(self._last_sent) > 4096:  # bounded: forget the oldest
            for k in sorted(self._last_sent, key=self._last_sent.__getitem__)[:1024]:
                del self._last_sent[k]
        return True


def build_routes(notify: Any, alertmanager: Any = None, grafana: Any = None) -> list[Route]:
    """Routes from the config's ``notify`` (and ``alertmanager``, ``grafana``) sections.

    ``notify.urls`` with ``notify.min_severity`` is route 0 (today's configs and
    ``SENTINEL_NOTIFY__URLS`` keep working), then ``notify.routes`` in order.
    """
    routes: list[Route] = []
    if notify.urls:
        routes.append(Route(
            "0", "apprise", tuple(u.get_secret_value() for u in notify.urls), notify.min_severity,
            cooldown_seconds=notify.cooldown_seconds, rate_limit_seconds=notify.rate_limit_seconds,
            resolved=notify.resolved))
    for r in notify.routes:
        routes.append(Route(
            r.name or str(len(routes)), "apprise", tuple(u.get_secret_value() for u in r.urls), r.min_severity,
            tuple(r.severities), tuple(r.alertnames), tuple(r.tags), tuple(r.runs), tuple(r.jobs),
            r.cooldown_seconds, r.rate_limit_seconds, r.resolved, r.format))
    if alertmanager is not None and alertmanager.url is not None:
        routes.append(Route("alertmanager", "alertmanager", (alertmanager.url.get_secret_value(),),
                            alertmanager.min_severity))
    if grafana is not None and grafana.url and grafana.token is not None:
        routes.append(Route("grafana", "grafana", (grafana.url,), grafana.min_severity,
                            token=grafana.token.get_secret_value()))
    return routes

