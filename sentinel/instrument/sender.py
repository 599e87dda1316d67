"""Senders carry encoded frames from the training process to an engine. They never block.

A sender's ``send`` returns False and counts the frame as dropped when the engine is
missing, slow or full; it never raises.
"""

from __future__ import annotations

import queue
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
