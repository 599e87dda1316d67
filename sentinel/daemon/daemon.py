"""``sentinel daemon``: the engine service behind a Unix datagram socket, until a signal.

One daemon per node (or per job) receives the frames of every rank. Its socket path is
handed to training processes in ``SENTINEL_SOCKET``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from sentinel import wire
from sentinel.config import SentinelConfig
from sentinel.daemon.folder import default_socket_path as default_socket_path  # re-exported (cli.py)
from sentinel.daemon.folder import remove_folder
from sentinel.daemon.listener import DatagramListener
from sentinel.daemon.processes import Replies
from sentinel.daemon.service import Service
from sentinel.rules.config import RulePack

log = logging.getLogger("sentinel")


class Daemon:
    """A :class:`Service` fed by a :class:`DatagramListener`.

    Args:
        config, pack: the validated config and rule pack.
        listen: HTTP address.
        socket_path: where training processes send frames.
        fallback_port: when ``listen``'s port is in use, serve on a free one (with a
            warning) rather than fail: ``sentinel run``'s, whose job must run; not a node's
            ``sentinel daemon``, whose address is what Prometheus scrapes.

    Raises:
        UnsafeFolder: the socket's folder is not ours to use (nothing is left running).
        OSError: the HTTP address cannot be bound.
    """

    def __init__(self, config: SentinelConfig, pack: RulePack, listen: str, socket_path: str,
                 fallback_port: bool = True) -> None:
        self.service = Service(config, pack, listen, on_message=self._route, fallback_port=fallback_port)
        try:
            self.listener = DatagramListener(socket_path, self.service.submit_many)
        except BaseException:
            self.service.stop()
            raise
        engine = self.service.engine
        self.replies = Replies(os.path.dirname(os.path.abspath(socket_path)))
        # first: the service's listeners (the capture action's arm) answer a rank's first frame
        engine.frame_listeners.insert(0, self.replies.note)
        engine.dropped_listeners.append(self.replies.dropped)
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)
        self.messages_sent = self.messages_failed = 0
        self.service.extra_rows.append(self.listener.rows)
        self.socket_path = socket_path
        self.url = self.service.url
        self._stopped = False

    def _route(self, msg: dict[str, Any]) -> None:
        """Alert and stop messages to the training processes of the run they are about,
        on the reply sockets their frames named (the engine's worker thread, under its
        lock). A stop goes to every rank: stopping one would leave the others hanging in
        their next collective. A message naming one ``rank`` (the capture action's ``arm``)
        goes to that rank only."""
        engine = self.service.engine
        key = (msg.get("job"), msg.get("run"))
        if msg.get("kind") == "stop":
            engine.halted.add((str(key[0]), str(key[1])))
        try:
            data = wire.encode_message(msg)
        except wire.FrameError:  # a bug on this side: the message is lost, the daemon goes on
            self.messages_failed += 1
            log.warning("sentinel daemon: a reply off the schema was not sent", exc_info=True)
            return
        only = msg.get("rank")
        for rk, path in list(self.replies.paths.items()):
            if rk[:2] != key or (only is not None and rk[2] != only):
                continue
            try:
                self._out.sendto(data, path)
                self.messages_sent += 1
            except OSError:  # the process is gone, or its queue is full: it is told no more
                self.messages_failed += 1

    def stop(self) -> None:
        """Stop serving: deliver what is queued, remove the socket (a second call does nothing)."""
        if self._stopped:
            return
        self._stopped = True
        self.listener.close()
        self.service.stop()
        self._out.close()
        self.replies.close()
        if self.listener.made_folder:
            remove_folder(self.listener.directory)


def serve_forever(daemon: Daemon, ready: Callable[[], object] | None = None, drain_seconds: float = 0.0) -> None:
    """Block until SIGINT or SIGTERM, then stop the daemon cleanly.

    Args:
        ready: called once the signals are handled (e.g. to print the address), so a
            supervisor that stops the daemon as soon as it is told still gets a clean stop.
        drain_seconds: after the signal, wait up to this long for the ranks it watches to
            say goodbye or be recorded as ended, so their exits are judged and delivered:
            inside a Slurm job, ``scancel`` and the time limit send SIGTERM to the daemon
            and the ranks at once (keep it below ``KillWait``).
    """
    stopping: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        # no lock here, so not threading.Event.set: the handler runs in the main thread,
        # which may hold that Event's lock at the very moment the signal lands (entering
        # its wait), and the daemon would never stop
        stopping.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)
    if ready is not None:
        ready()
    log.warning("sentinel daemon: frames on %s, metrics at %s/metrics", daemon.socket_path, daemon.url)
    while not stopping:
        time.sleep(0.1)  # a signal cuts the sleep short only to run the handler; the loop sees it
    deadline = time.monotonic() + drain_seconds
    engine = daemon.service.engine
    while time.monotonic() < deadline:
        daemon.service.flush()
        engine.tick()
        if not engine.pids:  # every reporting rank said goodbye or is recorded as ended
            break
        time.sleep(0.05)
    daemon.stop()
