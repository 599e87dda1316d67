"""Thread mode (``engine="thread"``): the engine service inside the training process.

The default is a child process (:mod:`sentinel.daemon.child`), which keeps the engine's
Python work off the training process's GIL; thread mode suits notebooks and tests that
want the store at hand.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from sentinel.config import load_config
from sentinel.daemon.service import Service

BATCH_SECONDS = 0.1
"""The engine thread ingests the frames of the last 0.1 s in one go (see :class:`Service`):
one GIL hand-over per batch instead of one per training step; alerts come up to 0.1 s later."""


class _ServiceSender:
    """A sender that hands frames straight to the service's intake queue."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.dropped = 0

    def send(self, data: bytes) -> bool:
        ok = self.service.submit(data)
        self.dropped += not ok
        return ok

    def close(self) -> None:
        pass


class EngineThread:
    """The engine :class:`Service` in this process, with the same surface as the child process.

    Args:
        listen: HTTP address.
        config: config file path, or None.

    Raises:
        ConfigError: the config is invalid.
    """

    def __init__(self, listen: str, config: str | None) -> None:
        cfg, pack = load_config(config)
        self._messages: deque[dict[str, Any]] = deque(maxlen=1000)
        self.service = Service(cfg, pack, listen, on_message=self._messages.append, batch_seconds=BATCH_SECONDS)
        self.engine = self.service.engine
        self.url = self.service.url
        self.sender = _ServiceSender(self.service)

    def poll(self) -> list[dict[str, Any]]:
        out = []
        while self._messages:
            out.append(self._messages.popleft())
        return out

    def flush(self, timeout: float = 5.0) -> bool:
        return self.service.flush(timeout)

    def stop(self) -> None:
        self.service.stop()
