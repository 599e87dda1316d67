"""The courier: turns alert transitions into outbox rows, and delivers them.

:meth:`Courier.submit` runs on the engine's thread: it matches routes, applies cooldowns,
renders each message and *stores* it (one SQLite insert per target, committed) before
anything is sent. A thread of its own then claims due rows and sends them, one route at a
time within its rate limit, retrying failures with exponential backoff and jitter, so a
slow or dead webhook never stalls the engine. A restarted daemon with the same outbox
file and routes delivers what was left pending.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sentinel.delivery.messages import body, title
from sentinel.delivery.outbox import Outbox, Row
from sentinel.delivery.routes import Route
from sentinel.delivery.secrets import describe
from sentinel.delivery.sinks import AlertmanagerSink, AppriseSink, GrafanaSink, alertmanager_alert
from sentinel.rules.alert import Transition

log = logging.getLogger("sentinel")
OUTCOMES = ("sent", "failed", "suppressed", "expired")
RowT = tuple[str, str, tuple[tuple[str, str], ...], float]


def notice_of(t: Transition, **extra: Any) -> dict[str, Any]:
    """A transition's JSON plus host, pid and ``extra`` (recent, metric, tags, grafana)."""
    n = t.to_json()
    n.update(host=socket.gethostname(), pid=os.getpid())
    n.update(extra)
    base = f"{t.alertname}\0{t.job}\0{t.run}\0{t.state_to}\0{t.started_at:.6f}\0{n['host']}"
    n["key"] = hashlib.sha256(base.encode()).hexdigest()[:20]
    return n


def test_routes(routes: Sequence[Route]) -> list[tuple[str, int, str, bool]]:
    """Send a test message through every URL of every route, now, without the outbox.

    Returns ``(route label, URL index, scheme, delivered)``: never the URL.
    """
    from datetime import datetime, timezone

    from sentinel.delivery.secrets import scheme_of

    host, pid = socket.gethostname(), os.getpid()
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out = []
    for r in routes:
        for i, url in enumerate(r.secrets):
            name = f"route {r.label} {describe(i, url)}"
            if r.sink == "grafana":
                ok = GrafanaSink(url, r.token, name).send({"annotation": {
                    "time": int(time.time() * 1000), "tags": ["sentinel", "sentinel-test"],
                    "text": f"sentinel alerts test from host {host}, pid {pid}"}})
            elif r.sink == "alertmanager":
                ok = AlertmanagerSink(url, name).send({"alerts": [alertmanager_alert(
                    {"alertname": "SentinelTest", "severity": "info", "job": "sentinel", "run": "test",
                     "summary": "sentinel alerts test", "host": host, "pid": pid, "started_at": time.time()},
                    time.time())]})
            else:
                ok = AppriseSink(url, name).send({
                    "title": f"[TEST] sentinel alerts test — route {r.label}",
                    "body": f"A test message from sentinel on host {host}, pid {pid}, at {stamp}.",
                    "notify_type": "info"})
            out.append((r.label, i, scheme_of(url), ok))
    return out


def notify_type(n: Mapping[str, Any]) -> str:
    if n.get("state_to") != "firing":
        return "success"
    return "failure" if n.get("severity") == "critical" else "warning"


class Courier:
    """Routes, the outbox and the delivery thread.

    Args:
        routes: from :func:`~sentinel.delivery.routes.build_routes`.
        outbox: the store.
        retry_initial, retry_max: backoff bounds in seconds.
        max_age: undelivered rows older than this are given up.
        resend_seconds: firing alerts are re-posted to Alertmanager this often.
        clock: wall clock, for tests.
    """

    def __init__(self, routes: Sequence[Route], outbox: Outbox, retry_initial: float = 1.0,
                 retry_max: float = 300.0, max_age: float = 86_400.0, resend_seconds: float = 60.0,
                 am_timeout: float = 5.0, clock: Callable[[], float] = time.time) -> None:
        self.routes = list(routes)
        self.outbox = outbox
        self.retry_initial, self.retry_max, self.max_age = retry_initial, retry_max, max_age
        self.resend_seconds = resend_seconds
        self.clock = clock
        self.counts: dict[tuple[str, str], int] = {(r.label, o): 0 for r in self.routes for o in OUTCOMES}
        self._sinks: dict[str, Any] = {}
        self._route_of: dict[str, Route] = {}
        for r in self.routes:
            for i, url in enumerate(r.secrets):
                target = r.target(i)
                name = f"route {r.label} {describe(i, url)}"
                self._sinks[target] = (AlertmanagerSink(url, name, am_timeout) if r.sink == "alertmanager"
                                       else GrafanaSink(url, r.token, name, am_timeout) if r.sink == "grafana"
                                       else AppriseSink(url, name))
                self._route_of[target] = r
        self._next_send: dict[str, float] = {}  # route label → earliest next send (rate limit)
        self._firing_am: dict[str, tuple[dict[str, Any], float]] = {}  # key → (notice, last post)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread: threading.Thread | None = None
        if self._sinks:
            self._thread = threading.Thread(target=self._loop, name="sentinel-courier", daemon=True)
            self._thread.start()

    # -- the engine's side -------------------------------------------------------------

    def submit(self, n: dict[str, Any]) -> int:
        """Store the messages for one notice (see :func:`notice_of`); returns rows stored."""
        now = self.clock()
        stored = 0
        for r in self.routes:
            if not r.matches(n):
                continue
            if not r.admit(n, now):
                self.counts[(r.label, "suppressed")] += 1
                continue
            payload = self._payload(r, n, now)
            for i in range(len(r.secrets)):
                target = r.target(i)
                key = f"{n['key']}-{target[:12]}" + ("" if r.sink != "alertmanager" else f"-{int(now * 1000)}")
                p = payload if r.sink != "apprise" else {**payload, "markdown": self._markdown(r, target)}
                stored += self.outbox.put(key, r.label, target, p, now)
        if stored:
            self._wake.set()
        return stored

    def _payload(self, r: Route, n: dict[str, Any], now: float) -> dict[str, Any]:
        if r.sink == "alertmanager":
            resolved = n.get("state_to") == "resolved"
            akey = f"{n.get('alertname')}\0{n.get('job')}\0{n.get('run')}"
            if resolved:
                self._firing_am.pop(akey, None)
            else:
                self._firing_am[akey] = (n, now)
            return {"alerts": [alertmanager_alert(n, float(n["time"]) if resolved else None)]}
        if r.sink == "grafana":
            from sentinel.dashboards.links import annotation

            resolved = n.get("state_to") == "resolved"
            alert = {**n, "state": n.get("state_to"), "resolved_at": n.get("time") if resolved else None}
            return {"annotation": annotation(alert, base_url=r.secrets[0])}
        return {"title": title(n), "body_text": body(n, markdown=False), "body_md": body(n, markdown=True),
                "notify_type": notify_type(n)}

    def _markdown(self, r: Route, target: str) -> bool:
        if r.format != "auto":
            return r.format == "markdown"
        return bool(getattr(self._sinks[target], "markdown", False))

    def resend(self) -> int:
        """Re-post firing alerts to Alertmanager when ``resend_seconds`` passed; call on the tick."""
        now = self.clock()
        out = 0
        for r in self.routes:
            if r.sink != "alertmanager":
                continue
            for akey, (n, last) in list(self._firing_am.items()):
                if now - last >= self.resend_seconds:
                    self._firing_am[akey] = (n, now)
                    payload = {"alerts": [alertmanager_alert(n, None)]}
                    out += self.outbox.put(f"{n['key']}-{r.target(0)[:12]}-{int(now * 1000)}", r.label,
                                           r.target(0), payload, now)
        if out:
            self._wake.set()
        return out

    # -- the delivery thread -------------------------------------------------------------

    def _loop(self) -> None:
        last_housekeeping = 0.0
        while not self._stop.is_set():
            now = self.clock()
            if now - last_housekeeping > 30.0:
                last_housekeeping = now
                self._housekeeping(now)
            rows = self.outbox.claim(list(self._sinks), now)
            if not rows:
                self._idle.set()
                self._wake.wait(0.25)
                self._wake.clear()
                continue
            self._idle.clear()
            for row in rows:
                self._deliver(row)

    def _deliver(self, row: Row) -> None:
        route = self._route_of[row.target]
        now = self.clock()
        ready = self._next_send.get(route.label, 0.0)
        if ready > now:
            self.outbox.defer(row.id, ready)
            return
        sink = self._sinks[row.target]
        payload = dict(row.payload)
        if "body_text" in payload:
            payload["body"] = payload["body_md"] if payload.get("markdown") else payload["body_text"]
        ok = sink.send(payload)
        now = self.clock()
        self._next_send[route.label] = now + route.rate_limit_seconds
        if ok:
            self.outbox.delivered(row.id, now)
            self.counts[(route.label, "sent")] += 1
            return
        self.counts[(route.label, "failed")] += 1
        delay = min(self.retry_max, self.retry_initial * 2.0 ** min(row.attempts, 30))
        delay *= random.uniform(0.5, 1.0)  # jitter: retries of many rows do not land together
        log.warning("sentinel notify: delivery on %s failed (attempt %d); retrying in %.1f s",
                    sink.name, row.attempts + 1, delay)
        self.outbox.retry(row.id, now + delay)

    def _housekeeping(self, now: float) -> None:
        for row in self.outbox.expire(list(self._sinks), now - self.max_age, now):
            self.counts[(row.route, "expired")] = self.counts.get((row.route, "expired"), 0) + 1
            log.warning("sentinel notify: gave up a notification on route %s after %d attempts",
                        row.route, row.attempts)
        self.outbox.prune(now)

    def drain(self, timeout: float) -> bool:
        """Wait until every message stored so far was attempted (delivered, or waiting
        for a retry); False on timeout."""
        deadline = time.monotonic() + timeout
        until = self.clock() + timeout
        while time.monotonic() < deadline and self._thread is not None and self._thread.is_alive():
            if not self.outbox.unsent(list(self._sinks), until):
                return True
            self._wake.set()
            self._idle.wait(0.05)
        return False

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is due (up to ``timeout``), then stop; undelivered rows stay stored,
        and one line says how many and where."""
        self.drain(timeout)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._say_left()
        self.outbox.close()

    def _say_left(self) -> None:
        """The last word of a stop with notifications undelivered (a route down or slow): the
        log's last delivery line says "retrying in 0.7 s", which this process will not do."""
        try:
            left = self.outbox.left()
        except sqlite3.Error:
            return
        if not left:
            return
        what = f"{left} notification{'s' if left != 1 else ''}"
        if self.outbox.durable:
            log.warning("sentinel notify: %s not delivered; kept in %s, they go out when Sentinel next "
                        "runs with this outbox and the same routes", what, self.outbox.path)
        else:
            log.warning("sentinel notify: %s not delivered and lost (the outbox is in memory)", what)

    def rows(self) -> Iterator[RowT]:
        """``/metrics`` rows: outcomes per route, outbox depth and oldest age, degradations."""
        for (route, outcome), n in sorted(self.counts.items()):
            yield ("sentinel_notifications_total", "counter", (("outcome", outcome), ("route", route)), float(n))
        depth, age = self.outbox.depth(list(self._sinks), self.clock())
        yield ("sentinel_outbox_depth", "gauge", (), float(depth))
        yield ("sentinel_outbox_oldest_age_seconds", "gauge", (), age)
        yield ("sentinel_outbox_degraded_total", "counter", (), float(self.outbox.degraded))
        yield ("sentinel_outbox_durable", "gauge", (), 1.0 if self.outbox.durable else 0.0)
