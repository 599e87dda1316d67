"""``sentinel daemon``: the engine service behind a Unix datagram socket, until a signal.

One daemon per node (or per job) receives the frames of every rank. Its socket path is
handed to training processes in ``SENTINEL_SOCKET``.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from types import FrameType

from sentinel.config import SentinelConfig
from sentinel.engine.listener import DatagramListener
from sentinel.engine.service import Service
from sentinel.rules.config import RulePack

log = logging.getLogger("sentinel")


def default_socket_path() -> str:
    """``$XDG_RUNTIME_DIR/sentinel/engine.sock``, else ``<tmp>/sentinel-<uid>/engine.sock``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "sentinel", "engine.sock")
    return os.path.join(tempfile.gettempdir(), f"sentinel-{os.getuid()}", "engine.sock")


class Daemon:
    """A :class:`Service` fed by a :class:`DatagramListener`.

    Args:
        config, pack: the validated config and rule pack.
        listen: HTTP address.
        socket_path: where training processes send frames.
    """

    def __init__(self, config: SentinelConfig, pack: RulePack, listen: str, socket_path: str) -> None:
        self.service = Service(config, pack, listen)
        self.listener = DatagramListener(socket_path, self.service.submit_many)
        self.service.extra_rows.append(self.listener.rows)
        self.socket_path = socket_path
        self.url = self.service.url

    def stop(self) -> None:
        self.listener.close()
        self.service.stop()


def serve_forever(daemon: Daemon) -> None:
    """Block until SIGINT or SIGTERM, then stop the daemon cleanly."""
    done = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        done.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)
    log.warning("sentinel daemon: frames on %s, metrics at %s/metrics", daemon.socket_path, daemon.url)
    done.wait()
    daemon.stop()
