"""The engine's end of the local transport: a Unix datagram socket, private to its user.

The socket lives in a 0700 directory and is itself 0600. Every datagram carries its
sender's credentials (``SO_PASSCRED``); frames from another uid are dropped and counted.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import threading
from collections.abc import Callable, Iterator

from sentinel.daemon.folder import clear_stale_socket, private_folder, remove_folder
from sentinel.wire import MAX_FRAME_BYTES

log = logging.getLogger("sentinel")
_UCRED = struct.Struct("3i")  # pid, uid, gid


class DatagramListener:
    """Receives frames on ``path`` and hands each to ``handle`` from a thread of its own.

    Raises:
        UnsafeFolder: the folder or the path is not ours to use (one line, no traceback
            needed: the CLI prints it and exits with status 2).

    Args:
        path: socket path; its directory is created 0700 if missing, and must otherwise
            be a real folder of this uid (see :mod:`sentinel.daemon.folder`).
        handle: called with the accepted datagrams, as ``[(data, sender pid), ...]``:
            all those waiting in the socket at once (a node's ranks report together).
    """

    def __init__(self, path: str, handle: Callable[[list[tuple[bytes, int | None]]], object]) -> None:
        self.path = path
        self.handle = handle
        self.foreign = 0  # datagrams from another uid
        self.oversized = 0
        self.directory = os.path.dirname(os.path.abspath(path))
        # never followed: a predictable /tmp path may be a symlink or folder someone planted
        self.made_folder = private_folder(self.directory)
        """Whether this listener created its folder (and so removes it, once empty, at close)."""
        clear_stale_socket(path)  # of an engine that died
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 2**20)
        old = os.umask(0o177)
        try:
            self._sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._sock.setblocking(False)
        self._poll = select.poll()
        self._poll.register(self._sock.fileno(), select.POLLIN)
        self._wait_ms = 200  # how long a poll waits; close() shortens it to drain
        self._closed = False
        self._draining = False
        self._thread = threading.Thread(target=self._loop, name="sentinel-listener", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        uid = os.getuid()
        space = socket.CMSG_SPACE(_UCRED.size)
        while not self._closed:
            try:
                # wait for the first datagram, then take every one waiting: the socket's
                # queue is short (net.unix.max_dgram_qlen), and one hand-over per burst
                # costs the engine's thread less than one per frame
                ready = self._poll.poll(self._wait_ms)
            except OSError:
                ready = []
            if not ready:
                if self._draining:
                    return  # nothing left in the socket: every frame sent before close is in
                continue
            batch: list[tuple[bytes, int | None]] = []
            for _ in range(256):
                try:
                    data, anc, flags, _ = self._sock.recvmsg(MAX_FRAME_BYTES + 1, space)
                except BlockingIOError:
                    break
                except OSError:
                    if self._closed:
                        return
                    break
                peer_pid = peer_uid = None
                for level, kind, payload in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                        peer_pid, peer_uid, _ = _UCRED.unpack(payload[: _UCRED.size])
                if peer_uid != uid:
                    self.foreign += 1
                    if self.foreign == 1:
                        log.warning("sentinel: refused a frame from uid %s (only uid %s may report)", peer_uid, uid)
                    continue
                if flags & socket.MSG_TRUNC or len(data) > MAX_FRAME_BYTES:
                    self.oversized += 1
                    continue
                batch.append((data, peer_pid))
            if batch:
                try:
                    self.handle(batch)
                except Exception:
                    log.warning("sentinel listener: handler failed", exc_info=True)

    def rows(self) -> Iterator[tuple[str, str, tuple[tuple[str, str], ...], float]]:
        """The listener's counters, for the exporter."""
        yield ("sentinel_daemon_frames_refused_total", "counter", (("reason", "uid"),), float(self.foreign))
        yield ("sentinel_daemon_frames_oversized_total", "counter", (), float(self.oversized))

    def close(self) -> None:
        """Receive what is already queued in the socket, then close it (idempotent)."""
        if self._closed:
            return
        self._wait_ms = 50
        self._draining = True
        self._thread.join(5.0)
        self._closed = True
        self._sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
        if self.made_folder:
            remove_folder(self.directory)
