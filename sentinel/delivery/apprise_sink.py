"""Delivers alert transitions through apprise, off the engine's thread.

The URL is the configuration (``slack://…``, ``ntfy://…``, ``json://…``). URLs are secrets:
log lines and errors name a URL by its index and scheme only, and apprise's own logger is
kept at WARNING because its DEBUG output prints webhook tokens.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import SecretStr

from sentinel.rules.lifecycle import Transition, compact_groups, compact_ranks

log = logging.getLogger("sentinel")
SEVERITY_ORDER = {"info": 0, "warning": 1, "critical": 2}


def redact(index: int, url: str) -> str:
    """``#1 (slack://…)``: how a URL may appear in a log line or an error."""
    scheme = url.split("://", 1)[0] if "://" in url else "?"
    return f"#{index} ({scheme}://…)"


def render(t: Transition) -> tuple[str, str]:
    """Title and body of a chat message for one transition.

    The body says what is wrong, where (run, ranks, groups, step), the value against its
    threshold, the likely causes and the first checks.
    """
    state = "FIRING" if t.state_to == "firing" else "RESOLVED"
    title = f"[{state}] {t.alertname} ({t.severity}) — run {t.run}"
    where = compact_ranks(t.ranks)
    if t.groups:
        where += f", groups {compact_groups(list(t.groups), limit=5)}"
    lines = [t.summary, "",
             f"run: {t.run} (job {t.job})", f"where: {where}", f"step: {t.step}",
             f"value: {t.value:.4g}  threshold: {t.threshold:.4g}"]
    if t.state_to == "firing":
        if t.causes:
            lines += ["", "likely causes:"] + [f"- {c}" for c in t.causes]
        if t.checks:
            lines += ["", "first checks:"] + [f"{i}. {c}" for i, c in enumerate(t.checks, 1)]
        if t.runbook:
            lines += ["", f"runbook: {t.runbook.strip()}"]
    return title, "\n".join(lines)


class AppriseNotifier:
    """Sends transitions to apprise URLs.

    Args:
        urls: apprise URLs (secrets).
        min_severity: transitions of lower severity are not sent.
    """

    def __init__(self, urls: Sequence[str | SecretStr], min_severity: str = "info") -> None:
        import apprise  # daemon side only

        logging.getLogger("apprise").setLevel(logging.WARNING)
        self.min_severity = min_severity
        self._targets: list[tuple[str, Any]] = []
        for i, u in enumerate(urls):
            url = u.get_secret_value() if isinstance(u, SecretStr) else u
            ap = apprise.Apprise()
            if not ap.add(url):
                raise ValueError(f"notify.urls.{i}: not a URL apprise understands: {redact(i, url)}")
            self._targets.append((redact(i, url), ap))

    def send(self, t: Transition) -> bool:
        """Deliver to every URL. True only if all succeeded; never raises."""
        if SEVERITY_ORDER.get(t.severity, 0) < SEVERITY_ORDER.get(self.min_severity, 0):
            return True
        title, body = render(t)
        ok = True
        for name, ap in self._targets:
            try:
                notify_type = "failure" if t.state_to == "firing" and t.severity == "critical" else (
                    "warning" if t.state_to == "firing" else "success")
                sent = bool(ap.notify(title=title, body=body, notify_type=notify_type))
            except Exception as exc:  # apprise plugins may raise despite the contract
                log.warning("sentinel notify: %s raised %s", name, type(exc).__name__)
                sent = False
            if not sent:
                log.warning("sentinel notify: delivery to %s failed for %s", name, t.alertname)
            ok = ok and sent
        return ok


class Dispatcher:
    """Runs notifiers on a thread of their own, so a slow webhook never stalls the engine.

    Args:
        notifiers: each has ``send(transition) -> bool``.
        maxsize: queued transitions at most; past that they are dropped and counted.
    """

    def __init__(self, notifiers: Sequence[Any], maxsize: int = 1000,
                 on_result: Callable[[Transition, bool], None] | None = None) -> None:
        self.notifiers = list(notifiers)
        self.sent = self.failed = self.dropped = 0
        self.on_result = on_result
        self._queue: queue.Queue[Transition | None] = queue.Queue(maxsize)
        self._thread = threading.Thread(target=self._loop, name="sentinel-notify", daemon=True)
        self._thread.start()

    def submit(self, t: Transition) -> None:
        if not t.notify or not self.notifiers:
            return
        try:
            self._queue.put_nowait(t)
        except queue.Full:
            self.dropped += 1

    def _loop(self) -> None:
        while True:
            t = self._queue.get()
            if t is None:
                return
            ok = all([n.send(t) for n in self.notifiers])
            if ok:
                self.sent += 1
            else:
                self.failed += 1
            if self.on_result is not None:
                try:
                    self.on_result(t, ok)
                except Exception:
                    log.warning("sentinel notify: result callback failed", exc_info=True)

    def stop(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (up to ``timeout``), then stop."""
        self._queue.put(None)
        self._thread.join(timeout)
