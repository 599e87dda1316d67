"""The engine as a running service: intake queue, rules, notifications, HTTP, ticks.

One class serves every mode: the child process that ``sentinel.watch`` starts by default,
the in-process thread mode, and ``sentinel daemon``. Transports only differ in how bytes
reach :meth:`Service.submit`.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sentinel.config import SentinelConfig
from sentinel.daemon import processes
from sentinel.daemon.console import AlertConsole
from sentinel.daemon.evidence import Capturer
from sentinel.daemon.gpu import GpuPoller, load_nvml
from sentinel.dashboards.links import dashboard_link
from sentinel.delivery.courier import Courier, notice_of
from sentinel.delivery.outbox import Outbox, default_path
from sentinel.delivery.routes import build_routes
from sentinel.engine.engine import Engine
from sentinel.history.db import default_path as default_history_path
from sentinel.history.recorder import Recorder
from sentinel.listen import parse_listen
from sentinel.rules.config import RulePack
from sentinel.rules.lifecycle import Transition
from sentinel.serve.exporter import StoreCollector, make_registry
from sentinel.serve.http import HttpServer
from sentinel.serve.profile import profile_filter
from sentinel.serve.snapshot import status_json
from sentinel.serve.status import asset, status_page
from sentinel.serve.webconfig import load_web_config
from sentinel.store import Row

log = logging.getLogger("sentinel")

Message = dict[str, Any]
"""What the service tells the training process: ``{"kind": "alert", …}``, ``{"kind": "stop",
"reason": …}``, and with ``actions.capture_on`` ``{"kind": "arm", "rank": …}`` (to that rank
only) and ``{"kind": "capture", "folder": …}`` (see :mod:`sentinel.daemon.evidence`)."""


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """Resident memory of this process from ``/proc/self/statm``; None where there is none.

    ``resource.getrusage`` only tells the peak, which would hide memory given back, so
    platforms without ``/proc`` export no RSS series rather than a misleading one.
    """
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def make_history(config: SentinelConfig) -> Recorder | None:
    """The history recorder of the config (None when ``history.enabled`` is false)."""
    h = config.history
    if not h.enabled:
        return None
    return Recorder(h.path or default_history_path(), h.max_points, h.keep_days * 86_400.0, h.max_bytes,
                    h.queue_size, h.flush_seconds, h.retry_seconds)


def attach_history(engine: Engine, history: Recorder) -> None:
    """Feed the recorder from the engine: every admitted frame, every alert transition, and
    the assembled steps of sharded runs (whose norms it records instead of rank 0's shards)."""
    engine.frame_listeners.append(history.offer_frame)
    engine.assembled_listeners.append(history.offer_assembled)
    engine.listeners.append(history.offer_transition)


def make_courier(config: SentinelConfig) -> Courier:
    """The routes of the config, its outbox file (or memory), and the delivery thread."""
    routes = build_routes(config.notify, config.alertmanager, config.grafana)
    o = config.outbox
    outbox = Outbox((o.path or default_path()) if routes else None, o.max_rows, o.keep_seconds)
    return Courier(routes, outbox, o.retry_initial_seconds, o.retry_max_seconds, o.max_age_seconds,
                   config.alertmanager.resend_seconds, config.alertmanager.timeout_seconds)


class Service:
    """Engine, notification courier and HTTP server, fed by a worker thread.

    Args:
        config: the validated config.
        pack: the effective rule pack.
        listen: ``HOST:PORT`` for HTTP; a busy port falls back to a free one (with a
            warning) unless ``fallback_port`` is False, when it raises ``OSError``.
        on_message: receives alert and stop messages for the training process.
        queue_size: frames waiting for ingest at most; past that they are dropped, counted.
        batch_seconds: once a frame arrives, let more gather this long and ingest them
            together (0: each at once). Thread mode sets it: an engine thread that woke for
            every frame would take the GIL from the training thread at every step.
        fallback_port: see ``listen``.
    """

    def __init__(self, config: SentinelConfig, pack: RulePack, listen: str,
                 on_message: Callable[[Message], None] | None = None, queue_size: int = 8192,
                 batch_seconds: float = 0.0, fallback_port: bool = True) -> None:
        self.config = config
        self.engine = Engine(pack=pack, ended_ttl=config.retention.ended_seconds,
                             idle_ttl=config.retention.idle_seconds, limits=config.limits.limits(),
                             alive=processes.alive, running=processes.running, node=socket.gethostname())
        self.on_message = on_message
        self.pack = pack
        self.courier = make_courier(config)
        a = config.actions
        self.capturer = Capturer(a.capture_on, a.capture_dir, self.engine.store, a.capture_keep,
                                 a.capture_max_bytes, a.capture_steps) if a.capture_on else None
        """The opt-in capture action (None without ``actions.capture_on``)."""
        self._captured: tuple[Transition, dict[str, Any] | None] | None = None
        self.console = AlertConsole(config.notify.console)
        """Warning and critical transitions on stderr, one line each (``notify.console``)."""
        # the console line first, as soon as it is known; then the capture: the
        # notifications and the message name its files
        self.engine.listeners += [self.console, self._capture, self._notify, self._actions]
        if self.capturer is not None:
            self.engine.frame_listeners.append(self._arm)
        self.history = make_history(config)
        """Where runs are recorded (None: history is off); the engine's thread only queues."""
        if self.history is not None:
            attach_history(self.engine, self.history)
        self.collector = StoreCollector(self.engine.store, extra=self._rows,
                                        select=profile_filter(config.profile, self.engine.rules.active))
        self.registry = make_registry(self.collector)
        host, port = parse_listen(listen)
        web = load_web_config(config.web.config_file) if config.web.config_file else None
        serve: dict[str, Any] = dict(registry=self.registry, healthy=self._alive, alerts=self.engine.api_alerts,
                                     status_page=status_page, status=lambda q: status_json(self.engine, q),
                                     assets=asset, exposition=self.collector.exposition, web=web)
        try:
            self.http = HttpServer(host, port, **serve)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or port == 0 or not fallback_port:
                raise
            log.warning("sentinel: %s:%d is in use (another run?); serving on a free port instead", host, port)
            self.http = HttpServer(host, 0, **serve)
        self.url = self.http.url
        self.extra_rows: list[Callable[[], Iterator[Row]]] = []
        """More rows for /metrics, e.g. the transport's counters."""
        self.gpu = GpuPoller(self.engine.store, load_nvml() if config.gpu.enabled else None,
                             config.gpu.interval_seconds)
        self.extra_rows.append(self.gpu.rows)
        self.extra_rows.append(self.http.rows)
        self.gpu.start()
        if self.history is not None:
            self.extra_rows.append(self.history.rows)
        self.received = 0
        self.processed = 0
        self._taken = 0  # frames the worker took off the queue
        self.dropped = 0
        # a SimpleQueue (C, lock-free for one producer) bounded here: queue.Queue's
        # conditions cost several µs a frame at 10,000 frames/s
        self.queue_size = queue_size
        self.batch_seconds = batch_seconds
        self._queue: queue.SimpleQueue[list[tuple[bytes, int | None]] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._hurry = threading.Event()  # a flush is waiting: ingest the gathered frames now
        self._thread = threading.Thread(target=self._loop, name="sentinel-engine", daemon=True)
        self._thread.start()

    def submit(self, data: bytes, pid: int | None = None) -> bool:
        """Queue one encoded frame for ingest; never blocks. False if dropped."""
        return self.submit_many([(data, pid)]) == 1

    def submit_many(self, frames: list[tuple[bytes, int | None]]) -> int:
        """Queue encoded frames (with their senders' pids) for ingest; never blocks.
        Frames past ``queue_size`` waiting are dropped and counted. Returns those queued.

        One thread submits (the listener, or the embedded engine's sender): ``received``
        is written only here and ``_taken`` only by the worker, so their difference is the
        queue's depth in frames."""
        room = self.queue_size - (self.received - self._taken)
        if room < len(frames):
            self.dropped += len(frames) - max(room, 0)
            frames = frames[:max(room, 0)]
        if frames:
            self.received += len(frames)
            self._queue.put(frames)
        return len(frames)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every frame submitted so far has been ingested; False on timeout."""
        deadline = time.monotonic() + timeout
        self._hurry.set()
        while self.processed < self.received:
            if time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.005)
        return True

    def stop(self) -> None:
        """Ingest what is queued, deliver queued notifications, stop serving."""
        self.flush()
        self._stop.set()
        self._hurry.set()
        self._queue.put(None)  # wake the worker now rather than at its timeout
        self._thread.join(2.0)
        self.gpu.stop()
        if self.history is not None:
            self.history.close()
        self.courier.stop()
        self.http.stop()

    def _loop(self) -> None:
        next_tick = time.monotonic() + 1.0
        while True:
            if time.monotonic() >= next_tick:  # stalls are noticed even when no frame comes
                next_tick = time.monotonic() + 1.0
                try:
                    self.engine.tick()
                    self.courier.resend()
                except Exception:
                    log.warning("sentinel engine: error in the rule tick", exc_info=True)
            try:
                # crashes found but not yet recorded are done a slice at a time between
                # batches, so frames of the living never wait behind a mass exit
                backlog = self.engine.crash_backlog
                if backlog:
                    self._reap()
                batch = self._queue.get(timeout=0.001 if backlog else 0.25)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            if batch is None:
                if self._stop.is_set():
                    return
                continue
            if self.batch_seconds > 0:
                batch = self._gather(batch)
            self._taken += len(batch)
            for data, pid in batch:
                try:
                    self.engine.feed(data, pid)
                except Exception:  # a bug in the engine must not kill the worker silently
                    log.warning("sentinel engine: error ingesting a frame", exc_info=True)
                finally:
                    self.processed += 1

    def _gather(self, first: list[tuple[bytes, int | None]]) -> list[tuple[bytes, int | None]]:
        """The frames that arrive within ``batch_seconds`` of ``first`` (less when flushing)."""
        self._hurry.wait(self.batch_seconds)
        self._hurry.clear()
        out = list(first)
        while True:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                return out
            if more is None:  # stop()'s wake-up: leave it for the loop, which then returns
                self._queue.put(None)
                return out
            out.extend(more)

    def _notify(self, t: Transition) -> None:
        """Store the notifications of a transition in the outbox (the engine's thread)."""
        if not t.notify or not self.courier.routes:
            return
        try:
            rule = self.pack.get(t.alertname)
            tags, metric = list(rule.tags), rule.metrics[0]
        except KeyError:
            tags, metric = [], ""
        recent = self._recent(t, metric)
        g = self.config.grafana
        link = dashboard_link(g.url, t.to_json() | {"resolved_at": t.time if t.state_to == "resolved" else None},
                              uid=g.dashboard_uid) if g.url else ""
        extra: dict[str, Any] = {}
        cap = self._capture_of(t)
        if cap is not None:
            extra = {"evidence": cap["evidence"], "inputs": cap["inputs"]}
        where = self._launcher_labels(t.job, t.run)
        if where:
            extra["labels"] = where
        self.courier.submit(notice_of(t, tags=tags, metric=metric, recent=recent, grafana=link, **extra))

    def _launcher_labels(self, job: str, run: str) -> dict[str, str]:
        """The run's ``slurm_*`` tags (job id, step id, node: ``sentinel run`` under Slurm),
        which label its alerts too."""
        for labels in self.engine.store.labelsets("sentinel_run_info"):
            d = dict(labels)
            if d.get("job") == job and d.get("run") == run:
                return {k: v for k, v in d.items() if k.startswith("slurm_")}
        return {}

    def _capture(self, t: Transition) -> None:
        """Write the evidence of a firing that ``actions.capture_on`` names (the engine's
        thread), before the other listeners store and send what names it."""
        self._captured = None
        if self.capturer is not None and self.capturer.wants(t):
            self._captured = (t, self.capturer.capture(t))

    def _capture_of(self, t: Transition) -> dict[str, Any] | None:
        """The capture :meth:`_capture` made of this very transition, if any."""
        c = self._captured
        return c[1] if c is not None and c[0] is t else None

    def _arm(self, frame: dict[str, Any]) -> None:
        """Tell a rank, at its first frame, to hold its inputs for a capture."""
        msg = self.capturer.arm_message(frame) if self.capturer is not None else None
        if msg is not None and self.on_message is not None:
            self.on_message(msg)

    def _recent(self, t: Transition, metric: str) -> list[float]:
        """The metric's last values on the alert's first rank (and group), for the sparkline."""
        if not metric or not t.ranks:
            return []
        store = self.engine.store
        want = {"job": t.job, "run": t.run, "rank": str(t.ranks[0])}
        for labels in store.labelsets(metric):
            d = dict(labels)
            if all(d.get(k) == v for k, v in want.items()) and (not t.groups or d.get("group") in (None, t.groups[0])):
                w = store.window(metric, labels, 24)
                return [float(v) for v in w.values] if w is not None else []
        return []

    def _reap(self) -> None:
        try:
            self.engine.reap()
        except Exception:  # a bug here must not kill the worker either
            log.warning("sentinel engine: error recording a crash", exc_info=True)

    def _actions(self, t: Transition) -> None:
        """Alert messages for the training process, and the opt-in stop action."""
        if self.on_message is None:
            return
        cap = self._capture_of(t)
        alert = {"kind": "alert", **t.to_json()}
        if cap is not None:
            self.on_message(cap["message"])
            alert["evidence"] = cap["evidence"]
        self.on_message(alert)
        stop_on = self.config.actions.stop_on
        if t.state_to == "firing" and (t.severity in stop_on or t.alertname in stop_on):
            self.on_message({"kind": "stop", "job": t.job, "run": t.run, "reason": (
                f"sentinel stopped training: {t.alertname} ({t.severity}) fired at step {t.step} "
                f"of run {t.run}: {t.summary}. Save a checkpoint and exit; first checks: "
                + "; ".join(t.checks[:3]) + (f". Evidence: {cap['evidence']}" if cap is not None else ""))})

    def _rows(self) -> Iterator[Row]:
        yield from self.engine.health_rows()
        yield ("sentinel_daemon_queue_depth", "gauge", (), float(self.received - self._taken))
        yield ("sentinel_daemon_queue_capacity", "gauge", (), float(self.queue_size))
        rss = resident_bytes()
        if rss is not None:
            yield ("sentinel_daemon_resident_memory_bytes", "gauge", (), float(rss))
        yield ("sentinel_daemon_frames_dropped_total", "counter", (), float(self.dropped))
        if self.capturer is not None:
            yield ("sentinel_captures_total", "counter", (("outcome", "written"),), float(self.capturer.written))
            yield ("sentinel_captures_total", "counter", (("outcome", "failed"),), float(self.capturer.failed))
        for extra in self.extra_rows:
            yield from extra()
        yield from self.courier.rows()

    def _alive(self) -> bool:
        return self._thread.is_alive()
