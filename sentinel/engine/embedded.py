"""The embedded engine: the daemon's engine, run in a thread of the training process."""

from __future__ import annotations

import errno
import logging
import queue
import threading
import time
from sentinel.engine.engine import Engine
from sentinel.engine.exporter import StoreCollector, make_registry
from sentinel.engine.http import HttpServer
from sentinel.instrument.options import WatchOptions, parse_listen
from sentinel.instrument.sender import QueueSender

log = logging.getLogger("sentinel")


class EmbeddedEngine:
    """An :class:`Engine` fed from a :class:`QueueSender` by a thread, served over HTTP.

    Args:
        options: the watch options (listen address, config).
        sender: the queue the training thread writes frames to.
    """

    def __init__(self, options: WatchOptions, sender: QueueSender) -> None:
        self.engine = Engine()
        self.sender = sender
        collector = StoreCollector(self.engine.store, extra=self.engine.health_rows)
        self.registry = make_registry(collector)
        host, port = parse_listen(options.listen)
        try:
            self.http = HttpServer(host, port, self.registry, healthy=self._alive)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or port == 0:
                raise
            log.warning("sentinel: %s:%d is in use (another run?); serving on a free port instead", host, port)
            self.http = HttpServer(host, 0, self.registry, healthy=self._alive)
        self.url = self.http.url
        log.info("sentinel: metrics at %s/metrics", self.url)
        self.processed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sentinel-engine", daemon=True)
        self._thread.start()

    def _alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        q = self.sender.queue
        while True:
            try:
                data = q.get(timeout=0.5)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            try:
                if data is not None:
                    self.engine.feed(data)
            except Exception:  # a bug in the engine must not kill the thread silently
                log.warning("sentinel engine: error ingesting a frame", exc_info=True)
            finally:
                self.processed += 1

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every frame sent so far has been ingested; False on timeout."""
        deadline = time.monotonic() + timeout
        while self.processed < self.sender.sent:
            if time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.005)
        return True

    def stop(self) -> None:
        """Ingest what is queued, then stop the thread and the HTTP server."""
        self.flush()
        self._stop.set()
        try:
            self.sender.queue.put_nowait(None)  # wake the thread now rather than at its timeout
        except queue.Full:
            pass
        self._thread.join(2.0)
        self.http.stop()


def start_embedded(options: WatchOptions) -> tuple[EmbeddedEngine, QueueSender]:
    """Start an embedded engine; returns it and the sender that feeds it."""
    sender = QueueSender()
    return EmbeddedEngine(options, sender), sender
