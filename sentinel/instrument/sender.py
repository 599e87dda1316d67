"""Senders carry encoded frames from the training process to an engine. They never block.

A sender's ``send`` returns False and counts the frame as dropped when the engine is
missing, slow or full; it never raises.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections import deque
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


class DatagramSender:
    """Sends frames as Unix datagrams to the engine's socket, never blocking.

    The socket is unconnected and every frame names the path, so a restarted engine is
    reached again with no reconnect logic; while it is gone, frames are dropped and counted.
    A Unix datagram socket queues only ``net.unix.max_dgram_qlen`` frames (10 by default),
    so a burst that finds the queue full waits in a small local backlog, sent first at the
    next ``send``; only when that backlog is full is the oldest frame dropped and counted.
    While frames wait there, a helper thread retries every few milliseconds, so the last
    frames of a burst arrive even when the training loop pauses (evaluation, a checkpoint,
    the end of training) instead of waiting for its next step.

    Args:
        path: the engine's socket path.
        backlog: frames kept while the engine's queue is full.
    """

    _FULL = (errno.EAGAIN, errno.ENOBUFS)
    _GONE = (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK)

    RETRY_SECONDS = 0.005

    def __init__(self, path: str, backlog: int = 256) -> None:
        self.path = path
        self.dropped = 0
        self.sent = 0
        self._backlog: deque[bytes] = deque()
        self._max_backlog = backlog
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._lock = threading.Lock()
        self._retrying = False  # a retry thread is running
        self._closed = False

    def _try(self, data: bytes) -> int:
        """0 if sent, else the errno (full or gone); EMSGSIZE and others drop the frame."""
        try:
            self._sock.sendto(data, self.path)
        except OSError as exc:
            return exc.errno or -1
        self.sent += 1
        return 0

    def _flush(self) -> bool:
        """Send what waits in the backlog; True when it is empty."""
        while self._backlog:
            err = self._try(self._backlog[0])
            if err in self._FULL:
                return False
            self._backlog.popleft()
            if err:  # gone or unsendable: counted, not retried
                self.dropped += 1
        return True

    def send(self, data: bytes) -> bool:
        with self._lock:
            if self._flush():
                err = self._try(data)
                if err == 0:
                    return True
                if err not in self._FULL:
                    self.dropped += 1
                    return False
            self._backlog.append(data)
            if len(self._backlog) > self._max_backlog:
                self._backlog.popleft()
                self.dropped += 1
            if not self._retrying and not self._closed:
                self._retrying = True
                threading.Thread(target=self._retry, name="sentinel-sender", daemon=True).start()
            return True

    def _retry(self) -> None:
        """Drain the backlog in the background; ends when it is empty."""
        while True:
            time.sleep(self.RETRY_SECONDS)
            with self._lock:
                if self._closed or self._flush():
                    self._retrying = False
                    return

    def close(self, timeout: float = 1.0) -> None:
        """Give the backlog up to ``timeout`` seconds to drain (off the hot path), then close."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._flush() or time.monotonic() >= deadline:
                    self._closed = True
                    self.dropped += len(self._backlog)
                    self._backlog.clear()
                    self._sock.close()
                    return
            time.sleep(0.01)
