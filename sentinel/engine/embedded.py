"""The embedded engine: the daemon's engine, run in a thread of the training process."""

from __future__ import annotations

import errno
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any
from sentinel.config import load_config
from sentinel.engine.engine import Engine
from sentinel.engine.exporter import Row, StoreCollector, make_registry
from sentinel.engine.http import HttpServer
from sentinel.engine.status import status_page
from sentinel.instrument.options import WatchOptions, parse_listen
from sentinel.instrument.sender import QueueSender
from sentinel.notify import AppriseNotifier, Dispatcher
from sentinel.rules.lifecycle import Transition

log = logging.getLogger("sentinel")


class EmbeddedEngine:
    """An :class:`Engine` fed from a :class:`QueueSender` by a thread, served over HTTP.

    Args:
        options: the watch options (listen address, config).
        sender: the queue the training thread writes frames to.
    """

    def __init__(self, options: WatchOptions, sender: QueueSender, monitor: Any = None) -> None:
        cfg, pack = load_config(options.config)
        self.config = cfg
        self.engine = Engine(pack=pack)
        self.sender = sender
        self.monitor = monitor
        notifiers = [AppriseNotifier(cfg.notify.urls, cfg.notify.min_severity)] if cfg.notify.urls else []
        self.dispatcher = Dispatcher(notifiers)
        self.engine.listeners += [self.dispatcher.submit, self._actions]
        collector = StoreCollector(self.engine.store, extra=self._rows)
        self.registry = make_registry(collector)
        host, port = parse_listen(options.listen)
        serve = dict(registry=self.registry, healthy=self._alive, alerts=self.engine.api_alerts,
                     status_page=lambda: status_page(self.engine))
        try:
            self.http = HttpServer(host, port, **serve)  # type: ignore[arg-type]
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or port == 0:
                raise
            log.warning("sentinel: %s:%d is in use (another run?); serving on a free port instead", host, port)
            self.http = HttpServer(host, 0, **serve)  # type: ignore[arg-type]
        self.url = self.http.url
        log.info("sentinel: metrics at %s/metrics", self.url)
        self.processed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sentinel-engine", daemon=True)
        self._thread.start()

    def _actions(self, t: Transition) -> None:
        """In-process actions: user callbacks, and the opt-in stop."""
        if self.monitor is None:
            return
        self.monitor._alert(t.to_json())
        stop_on = self.config.actions.stop_on
        if t.state_to == "firing" and (t.severity in stop_on or t.alertname in stop_on):
            self.monitor.request_stop(
                f"sentinel stopped training: {t.alertname} ({t.severity}) fired at step {t.step} "
                f"of run {t.run}: {t.summary}. Save a checkpoint and exit; first checks: "
                + "; ".join(t.checks[:3]))

    def _rows(self) -> Iterator[Row]:
        yield from self.engine.health_rows()
        d = self.dispatcher
        for result, n in (("sent", d.sent), ("failed", d.failed), ("dropped", d.dropped)):
            yield ("sentinel_notifications_total", "counter", (("result", result),), float(n))

    def _alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        q = self.sender.queue
        next_tick = time.monotonic() + 1.0
        while True:
            if time.monotonic() >= next_tick:  # stalls are noticed even with no frames at all
                next_tick = time.monotonic() + 1.0
                try:
                    self.engine.tick()
                except Exception:
                    log.warning("sentinel engine: error in the rule tick", exc_info=True)
            try:
                data = q.get(timeout=0.25)
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
        self.dispatcher.stop()
        self.http.stop()


def start_embedded(options: WatchOptions, monitor: Any = None) -> tuple[EmbeddedEngine, QueueSender]:
    """Start an embedded engine; returns it and the sender that feeds it.

    Raises:
        ConfigError: the config file named by ``options.config`` is invalid.
    """
    sender = QueueSender()
    return EmbeddedEngine(options, sender, monitor), sender
