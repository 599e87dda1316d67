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
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

from sentinel import wire
from sentinel.errors import ConfigError
from sentinel.instrument.options import DEFAULTED_RUNS, WatchOptions
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
    key = (os.getpid(), mode, options.listen, options.config)
    with _starting:  # monitors made at once in threads of their own (trials in threads) share one engine
        share = _shares.get(key)
        if share is not None:  # this process's engine for these options: one run, one address
            if options.run in DEFAULTED_RUNS:  # no name of its own: its streams are of the first's run
                options.run = share.run
            use = EngineShare(share)
            return use.sender, use, use.url
        import sentinel  # the package root knows the daemon side; this module never imports it

        try:
            engine = sentinel._start_engine(options)  # sentinel.daemon.launch.start
            use = EngineShare(_Share(key, engine, options.run))
            return use.sender, use, use.url
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


class _Share:
    """One engine of this process and the monitors that use it."""

    def __init__(self, key: tuple[Any, ...], engine: Any, run: str) -> None:
        self.key, self.engine, self.run = key, engine, run
        self.users: list[EngineShare] = []
        self.lock = threading.Lock()  # monitors stepped in threads of their own poll it too
        _shares[key] = self


_shares: dict[tuple[Any, ...], _Share] = {}
"""The live engines of this process, by (pid, engine mode, listen, config)."""
_starting = threading.Lock()
"""Held while a monitor looks for its engine or starts it."""


class EngineShare:
    """A monitor's hold on its engine, which the monitors of one process that ask for the
    same one (engine mode, ``listen``, ``config``) share: a GAN's ``watch(generator, opt_g)``
    and ``watch(discriminator, opt_d)``, Lightning's optimizers in manual optimization.
    Each started an engine of its own before: two exporters, the second on a port nobody
    scrapes, both streams unlabelled, and two writers of one history.

    Each user has a sender of its own (closing it leaves the others' open); the engine
    stops when its last user stops. Of the engine's messages, every user gets the stop
    action's and the capture action's; an alert goes to the first user that polls, which
    gives it to every user's callbacks (:meth:`callbacks`), each callable once.
    """

    def __init__(self, share: _Share) -> None:
        self._share = share
        engine = share.engine
        path = getattr(engine, "socket_path", None)
        self.sender: Sender = engine.sender if not share.users or path is None else DatagramSender(path)
        self._inbox: list[dict[str, Any]] = []
        self._alerts: list[Any] = []
        share.users.append(self)

    @property
    def url(self) -> str | None:
        url: str | None = self._share.engine.url
        return url

    @property
    def shared(self) -> Any:
        """The engine itself (an ``EngineProcess`` or an ``EngineThread``)."""
        return self._share.engine

    @property
    def run(self) -> str:
        """The run of the engine's first user (a later one with no name of its own joins it)."""
        return self._share.run

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_share":
            raise AttributeError(name)  # copy and pickle look these up before __init__ ran
        return getattr(self._share.engine, name)  # what tests and the daemon side read of it

    def callbacks(self, mine: list[Any]) -> Any:
        """The alert callbacks to give each alert this user polls: its own (``mine``, kept
        as the list it is) and every live user's, each once."""
        self._alerts = mine
        return _Callbacks(self)

    def poll(self) -> list[dict[str, Any]]:
        share = self._share
        with share.lock:  # at every step: nothing allocated while the engine says nothing
            got = share.engine.poll()
            others = [m for m in got if m.get("kind") != "alert"] if got else None
            if others:
                for user in share.users:
                    if user is not self:
                        user._inbox += others
            if self._inbox:
                got, self._inbox = self._inbox + got, []
        return got

    def stop(self) -> None:
        share = self._share
        with share.lock:
            if self in share.users:
                share.users.remove(self)
            if share.users:
                return
            if _shares.get(share.key) is share:
                del _shares[share.key]
        share.engine.stop()


class _Callbacks:
    """A user's alert callbacks and every live user's of its share, each once, as the
    reporter iterates them (a user's own still after it stopped: its last poll)."""

    def __init__(self, use: EngineShare) -> None:
        self._use = use

    def __iter__(self) -> Iterator[Any]:
        seen: list[Any] = []
        for user in [self._use, *self._use._share.users]:
            for cb in user._alerts:
                if not any(cb is s or cb == s for s in seen):
                    seen.append(cb)
        return iter(seen)
