"""The engine: decode → store → rules. One code path for the embedded engine and the daemon."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sentinel import wire
from sentinel.engine.exporter import Row
from sentinel.engine.ingest import Ingestor
from sentinel.engine.store import Store

log = logging.getLogger("sentinel")


class Engine:
    """Accepts encoded frames and keeps the series and alert state.

    Args:
        store: the series store (a fresh one by default).
        clock: wall clock, for tests.
    """

    def __init__(self, store: Store | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store = store or Store()
        self.clock = clock
        self.ingestor = Ingestor(self.store)
        self.frames_received = 0
        self.frames_malformed = 0
        self.finished: set[tuple[str, str, int]] = set()
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> bool:
        """Ingest one encoded frame. Returns False (and counts it) if it was rejected."""
        with self._lock:
            self.frames_received += 1
            try:
                frame = wire.decode(data)
            except wire.FrameError as exc:
                self.frames_malformed += 1
                if self.frames_malformed == 1:
                    log.warning("sentinel engine: dropped a bad frame (%s); further ones are only counted", exc)
                return False
            self.ingest(frame)
            return True

    def ingest(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Record a decoded frame; returns the rules' context."""
        key = (frame["job"], frame["run"], frame["rank"])
        if frame["kind"] == "bye":
            self.finished.add(key)
        else:
            self.finished.discard(key)
        return self.ingestor.ingest(frame)

    def health_rows(self) -> Iterator[Row]:
        """The engine's own metrics, for the exporter."""
        yield ("sentinel_daemon_up", "gauge", (), 1.0)
        yield ("sentinel_daemon_frames_received_total", "counter", (), float(self.frames_received))
        yield ("sentinel_daemon_frames_malformed_total", "counter", (), float(self.frames_malformed))
