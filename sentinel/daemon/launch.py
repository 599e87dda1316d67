"""The daemon side of ``watch()``: start a monitor's own engine, in a child process
(:class:`EngineProcess`) or a thread (:class:`~sentinel.daemon.embedded.EngineThread`), and
read a config file's guard. It runs in the training process, and is imported only when a
monitor starts its own engine (through the package root, ``sentinel._start_engine``): the
engine's own imports happen in the child, or in the thread's module.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Any

from sentinel.instrument.link import _drain
from sentinel.instrument.options import WatchOptions
from sentinel.instrument.sender import DatagramSender

log = logging.getLogger("sentinel")


def start(options: WatchOptions) -> Any:
    """A monitor's own engine (``options.engine``: ``process`` or ``thread``), its config
    checked first.

    Raises:
        ConfigError: the config file is invalid (``watch()`` says so, at construction).
        Exception: the engine did not start (the monitor goes on without one).
    """
    if options.config:
        from sentinel.config import load_config

        load_config(options.config)
    if options.engine == "thread":
        from sentinel.daemon.embedded import EngineThread

        return EngineThread(options.listen, options.config)
    return EngineProcess(options.listen, options.config)


def config_guard(path: str) -> Any:
    """``actions.guard`` of the config file at ``path`` as ``watch(guard=...)`` takes it (None: off)."""
    from sentinel.config import load_config

    cfg, _ = load_config(path)
    return cfg.actions.guard.to_options()


RESTART_DELAYS = (1.0, 2.0, 5.0, 15.0, 60.0)
"""Seconds before each restart of a dead engine process (the last repeats)."""
MAX_RESTARTS = 5
"""Restarts before the monitor gives up and training goes on unmonitored."""
CHECK_SECONDS = 1.0
"""How often :meth:`EngineProcess.poll` looks at the child (one ``waitpid(WNOHANG)``)."""


class EngineProcess:
    """A child process running the engine, with its frame socket and a reply socket.

    A child that dies (the OOM killer, a bug) is noticed at the next :meth:`poll` (at
    most once a second), logged once as a warning, and started again after a backoff
    (:data:`RESTART_DELAYS`, at most :data:`MAX_RESTARTS` times) on the same socket, so
    the sender reaches it again with nothing to reconnect; frames meanwhile are dropped
    and counted. The new engine exports ``sentinel_engine_restarts_total``.

    Args:
        listen: HTTP address for the engine.
        config: config file path, or None.
        timeout: seconds to wait for the child to be ready.

    Raises:
        RuntimeError: the child did not become ready in time (its stderr says why).
    """

    def __init__(self, listen: str, config: str | None, timeout: float = 30.0) -> None:
        self.dir = tempfile.mkdtemp(prefix="sentinel-")  # 0700
        self.socket_path = os.path.join(self.dir, "engine.sock")
        reply_path = os.path.join(self.dir, "reply.sock")
        self._reply = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.messages: deque[dict[str, Any]] = deque(maxlen=1000)
        self.url: str | None = None
        self.deaths = 0
        """Times the child was found dead."""
        self.restarts = 0
        """Times it was started again."""
        self._owner = os.getpid()  # a forked copy of this object (a DataLoader worker) restarts nothing
        self._stopping = False
        self._next_check = 0.0
        self._restart_at: float | None = None
        self._cmd = [sys.executable, "-m", "sentinel.daemon.child", "--socket", self.socket_path,
                     "--reply", reply_path, "--listen", listen] + (["--config", config] if config else [])
        try:
            self._reply.bind(reply_path)
            os.chmod(reply_path, 0o600)
            self._reply.setblocking(False)
            self.proc = self._spawn()
        except BaseException:
            self._reply.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        deadline = time.monotonic() + timeout
        while self.url is None:
            self._read()
            if self.url is not None:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sentinel engine process did not start (exit status {self.proc.returncode})")
            time.sleep(0.02)
        self.sender = DatagramSender(self.socket_path)

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self._cmd + ["--restarts", str(self.restarts)], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, start_new_session=False)

    def _read(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for msg in _drain(self._reply):
            if msg.get("kind") == "ready":
                self.url = str(msg.get("url"))
            else:
                out.append(msg)
        return out

    def poll(self) -> list[dict[str, Any]]:
        """Messages from the engine received since the last poll (never blocks); notices
        a dead engine and restarts it when its backoff is over (never raises)."""
        out: list[dict[str, Any]] = list(self.messages)  # what stop() collected last
        self.messages.clear()
        out += self._read()
        try:
            self._watch()
        except Exception:  # monitoring may be lost; training never is
            log.debug("sentinel: checking the engine process failed", exc_info=True)
        return out

    def _watch(self) -> None:
        now = time.monotonic()
        if now < self._next_check or self._stopping or os.getpid() != self._owner:
            return
        self._next_check = now + CHECK_SECONDS
        if self._restart_at is not None:
            if now >= self._restart_at:
                self._restart_at = None
                self.restarts += 1
                self.proc = self._spawn()
            return
        status = self.proc.poll()
        if status is None:
            return
        self.deaths += 1
        how = (f"was killed by {_signal_name(-status)}" if status < 0 else f"exited with status {status}")
        if self.restarts >= MAX_RESTARTS:
            if self.deaths == MAX_RESTARTS + 1:
                log.warning("sentinel: the engine process %s again after %d restarts; giving up: training goes on "
                            "unmonitored", how, self.restarts)
            return
        delay = RESTART_DELAYS[min(self.restarts, len(RESTART_DELAYS) - 1)]
        if self.deaths == 1:  # once: a crash loop must not flood the training log
            log.warning("sentinel: the engine process (pid %d) %s; training goes on, its frames are dropped and "
                        "counted until the engine is restarted (in %.0f s, then with backoff)", self.proc.pid, how,
                        delay)
        self._restart_at = now + delay

    def stop(self, timeout: float = 10.0) -> None:
        """Let the engine ingest what it has and exit; kill it if it does not."""
        self._stopping = True
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(2)
        except Exception:
            pass
        self.messages.extend(self._read())  # the engine's last words (alerts resolved at exit)
        self._reply.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
