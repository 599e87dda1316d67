"""Where a monitor's frames go, and the way back: a shared daemon's socket
(:class:`DaemonLink`), or the monitor's own engine, which the daemon side starts
(:mod:`sentinel.daemon.launch`, reached through the package root so that nothing here
imports it).

Only the standard library, :mod:`sentinel.wire` and :mod:`sentinel.errors`.
"""

from __future__ import annotations

import logging
import os
import select
import socket
from collections import deque
from typing import Any

from sentinel import wire
from sentinel.errors import ConfigError
from sentinel.instrument.options import WatchOptions
from sentinel.instrument.sender import DatagramSender, NullSender, Sender

log = logging.getLogger("sentinel")


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
    import sentinel  # the package root knows the daemon side; this module never imports it

    try:
        engine = sentinel._start_engine(options)  # sentinel.daemon.launch.start
        return engine.sender, engine, engine.url
    except ConfigError:
        raise  # a bad config is loud, at construction
    except Exception as exc:
        log.warning("sentinel: the engine failed to start (%s: %s); training continues unmonitored",
                    type(exc).__name__, str(exc)[:200])
        log.debug("sentinel: the engine failed to start", exc_info=True)
        return NullSender(), None, None


def config_guard(path: str) -> Any:
    """``actions.guard`` of the config file at ``path`` as ``watch(guard=...)`` takes it (None:
    off), read by the daemon side (:func:`sentinel.daemon.launch.config_guard`)."""
    import sentinel

    return sentinel._config_guard(path)
