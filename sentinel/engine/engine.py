"""The engine: decode → store → rules → alerts. One code path for the embedded engine and
the daemon."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from sentinel import wire
from sentinel.engine.exporter import Row
from sentinel.engine.ingest import Ingestor
from sentinel.engine.store import Store
from sentinel.rules.config import RulePack, load_pack
from sentinel.rules.evaluator import RuleEngine
from sentinel.rules.lifecycle import Transition

log = logging.getLogger("sentinel")

Listener = Callable[[Transition], None]


class Engine:
    """Accepts encoded frames, keeps the series, evaluates the rules, hands out transitions.

    Args:
        store: the series store (a fresh one by default).
        pack: the rule pack (the built-in defaults by default).
        clock: wall clock, for tests.
        history: transitions kept in memory for the API.
    """

    def __init__(self, store: Store | None = None, pack: RulePack | None = None,
                 clock: Callable[[], float] = time.time, history: int = 500) -> None:
        self.store = store or Store()
        self.clock = clock
        self.ingestor = Ingestor(self.store)
        self.rules = RuleEngine(pack if pack is not None else load_pack(), self.store, clock)
        self.listeners: list[Listener] = []
        self.transitions: deque[Transition] = deque(maxlen=history)
        self.frames_received = 0
        self.frames_malformed = 0
        self.listener_errors = 0
        self.finished: set[tuple[str, str, int]] = set()
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> bool:
        """Ingest one encoded frame. Returns False (and counts it) if it was rejected."""
        with self._lock:
            self.frames_received += 1
            try:
                frame = wire.decode(data)
                self.ingest(frame)
            except Exception as exc:  # FrameError, or a field of a valid frame with a bad value
                self.frames_malformed += 1
                if self.frames_malformed == 1:
                    log.warning("sentinel engine: dropped a bad frame (%s: %s); further ones are only counted",
                                type(exc).__name__, exc)
                return False
            return True

    def ingest(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Record a decoded frame and evaluate the rules; returns the rules' context."""
        job, run, rank, kind = frame["job"], frame["run"], frame["rank"], frame["kind"]
        ctx = self.ingestor.ingest(frame)
        if kind == "bye":
            self.finished.add((job, run, rank))
            self._publish(self.rules.retire(job, run, rank))
        elif kind in ("step", "log"):
            self.finished.discard((job, run, rank))
            self._publish(self.rules.evaluate(job, run, rank, frame["step"], float(frame["t"]), ctx))
        return ctx

    def tick(self, now: float | None = None) -> list[Transition]:
        """Time-based rules (stalls) and group waits; call about once a second."""
        with self._lock:
            out = self.rules.tick(now)
            self._publish(out)
            return out

    def _publish(self, transitions: list[Transition]) -> None:
        for t in transitions:
            self.transitions.append(t)
            log.info("sentinel alert %s: %s", t.state_to, t.summary)
            for listener in self.listeners:
                try:
                    listener(t)
                except Exception:
                    self.listener_errors += 1
                    log.warning("sentinel engine: alert listener failed", exc_info=True)

    def alerts_json(self) -> list[dict[str, Any]]:
        """Active (pending, firing) then recently resolved alerts, as the HTTP API shows them."""
        return self.rules.active() + self.rules.recent()

    def api_alerts(self) -> dict[str, Any]:
        """The body of ``GET /api/v1/alerts``."""
        return {"status": "success", "data": {"alerts": self.alerts_json()}}

    def health_rows(self) -> Iterator[Row]:
        """The engine's own metrics and the firing alerts, for the exporter."""
        yield ("sentinel_daemon_up", "gauge", (), 1.0)
        yield ("sentinel_daemon_frames_received_total", "counter", (), float(self.frames_received))
        yield ("sentinel_daemon_frames_malformed_total", "counter", (), float(self.frames_malformed))
        yield ("sentinel_daemon_rule_evaluations_total", "counter", (), float(self.rules.evaluations))
        for labels, value in self.rules.firing_series():
            yield ("sentinel_alert_firing", "gauge", tuple(sorted(labels.items())), value)
