"""Senders carry encoded frames from the training process to an engine. They never block.

A sender's ``send`` returns False and counts the frame as dropped when the engine is
missing, slow or full; it never raises.
"""

from __future__ import annotations

import errno
import queue
import socket
from typing import Protocol


class Sender(Protocol):
    dropped: int

    def send(self, data: bytes) -> bool:
        """Hand over one frame without blocking; False if it was dropped."""
        ...

    def close(self) -> None: ...


class NullSender:
    """Drops (and counts) everything: used when no engine could be reached."""

    def __init__(self) -> None:
        self.dropped = 0

    def send(self, data: bytes) -> bool:
        self.dropped += 1
        return False

    def close(self) -> None:
        pass


class QueueSender:
    """In-process transport to the embedded engine's thread.

    Args:
        maxsize: frames buffered at most; past that, frames are dropped and counted.
    """

    def __init__(self, maxsize: int = 4096) -> None:
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize)
        self.dropped = 0
        self.sent = 0
        self.closed = False

    def send(self, data: bytes) -> bool:
        if self.closed:
            self.dropped += 1
            return False
        try:
            self.queue.put_nowait(data)
        except queue.Full:
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        self.closed = True


class DatagramSender:
    """Sends frames as Unix datagrams to the engine's socket, never blocking.

    The socket is unconnected and every frame names the path, so a restarted engine is
    reached again with no reconnect logic; while it is gone, frames are dropped and counted.

    Args:
        path: the engine's socket path.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.dropped = 0
        self.sent = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)

    def send(self, data: bytes) -> bool:
        try:
            self._sock.sendto(data, self.path)
        except OSError as exc:  # gone (ENOENT, ECONNREFUSED) or full (EAGAIN): drop it
            self.dropped += 1
            if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN, errno.ENOBUFS,
                                 errno.EMSGSIZE):
                raise
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        self._sock.close()
