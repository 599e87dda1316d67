"""The training process's side of the engine process: spawn it, read its messages.

Only the standard library and :mod:`sentinel.wire`: the engine's own imports happen in the child.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Any

from sentinel import wire
from sentinel.instrument.options import WatchOptions
from sentinel.instrument.sender import DatagramSender, NullSender, Sender

log = logging.getLogger("sentinel")


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


def _drain(sock: socket.socket) -> list[dict[str, Any]]:
    """The engine's messages waiting on a non-blocking socket (at most 100; never blocks), as
    maps; bytes that are no message of :mod:`sentinel.wire` are dropped."""
    out: list[dict[str, Any]] = []
    for _ in range(100 if sock.fileno() >= 0 else 0):
        if not select.select([sock], [], [], 0)[0]:  # cheaper than a failing recv
            break
        try:
            data = sock.recv(65536)
        except OSError:
            break
        msg = wire.decode_message(data)
        if msg is not None:
            out.append(msg)
    return out


class DaemonLink:
    """The way back from a shared daemon (``sentinel run``, a sidecar) to this process.

    A socket of this process's own in the daemon's private folder; its path rides on the
    step frames (``reply``), and the daemon sends alert and stop messages there, as the
    engine process of ``watch`` does on its reply socket.

    Args:
        daemon_socket: the daemon's socket path.
    """

    def __init__(self, daemon_socket: str) -> None:
        self.url = os.environ.get("SENTINEL_URL")
        self.messages: deque[dict[str, Any]] = deque()
        folder = os.path.dirname(os.path.abspath(daemon_socket))
        self.reply_path = os.path.join(folder, f"reply-{os.getpid()}-{id(self):x}.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        old = os.umask(0o177)
        try:
            self._sock.bind(self.reply_path)
        except OSError:
            self._sock.close()
            raise
        finally:
            os.umask(old)
        self._sock.setblocking(False)

    def poll(self) -> list[dict[str, Any]]:
        """Messages from the daemon received since the last poll (never blocks)."""
        out = list(self.messages) + _drain(self._sock)
        self.messages.clear()
        return out

    def stop(self) -> None:
        """Keep what is waiting for the last poll, close and remove the socket."""
        self.messages.extend(_drain(self._sock))
        self._sock.close()
        try:
            os.unlink(self.reply_path)
        except OSError:
            pass


def connect(options: WatchOptions) -> tuple[Sender, Any, str | None]:
    """Where a monitor's frames go: ``(sender, engine or None, metrics URL or None)``.

    A daemon's socket in ``SENTINEL_SOCKET`` (``sentinel run``, a sidecar) wins in process
    mode; otherwise the monitor's own engine starts (a child process, or a thread). An
    engine that fails to start leaves training unmonitored, with a warning; a bad config
    raises :class:`~sentinel.rules.config.ConfigError` here, at construction.
    """
    mode = options.engine
    if mode == "off":
        return NullSender(), None, None
    daemon_socket = os.environ.get("SENTINEL_SOCKET")
    if daemon_socket and mode == "process":
        try:
            link: DaemonLink | None = DaemonLink(daemon_socket)
        except OSError:  # no way back (e.g. the daemon's folder is gone): frames still go
            log.warning("sentinel: no reply socket beside %s; alerts will not reach this process",
                        daemon_socket, exc_info=True)
            link = None
        return DatagramSender(daemon_socket), link, os.environ.get("SENTINEL_URL")
    if options.config:
        from sentinel.config import load_config  # validate now: loud at construction

        load_config(options.config)
    try:
        engine: Any
        if mode == "thread":
            from sentinel.daemon.embedded import EngineThread

            engine = EngineThread(options.listen, options.config)
        else:
            engine = EngineProcess(options.listen, options.config)
        return engine.sender, engine, engine.url
    except Exception as exc:
        from sentinel.rules.config import ConfigError

        if isinstance(exc, ConfigError):
            raise
        log.warning("sentinel: the engine failed to start (%s: %s); training continues unmonitored",
                    type(exc).__name__, str(exc)[:200])
        log.debug("sentinel: the engine failed to start", exc_info=True)
        return NullSender(), None, None


def config_guard(path: str) -> Any:
    """``actions.guard`` of the config file at ``path`` as ``watch(guard=...)`` takes it (None:
    off). The config side is imported here, at the link, as :func:`connect` does."""
    from sentinel.config import load_config

    cfg, _ = load_config(path)
    return cfg.actions.guard.to_options()
