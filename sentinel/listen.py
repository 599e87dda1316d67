"""Where a server listens: ``HOST:PORT`` (the ground floor: the training side's options and the
daemon's service read it alike, and it imports nothing of the package)."""

from __future__ import annotations


def parse_listen(listen: str) -> tuple[str, int]:
    """Split ``HOST:PORT``.

    Raises:
        ValueError: not of the form ``HOST:PORT`` with a port in 0..65535.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen: expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
