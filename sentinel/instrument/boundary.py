"""The boundary between a probe and training: nothing escapes, failures are counted."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("sentinel")

T = TypeVar("T")


class Boundary:
    """Runs probes so that an exception never reaches the training loop.

    Each failure is counted (the frames' ``errors``, ``sentinel_instrument_errors_total``);
    the first failure of a probe is logged in one line (its traceback at DEBUG);
    a probe that fails ``max_errors`` times is switched off for the rest of the run.

    Args:
        max_errors: failures after which a probe is switched off.
    """

    def __init__(self, max_errors: int = 3) -> None:
        self.max_errors = max_errors
        self.errors = 0
        self.failures: dict[str, int] = {}
        self.disabled: set[str] = set()

    def run(self, probe: str, fn: Callable[..., T], *args: Any, default: T | None = None) -> T | None:
        """Call ``fn(*args)`` unless ``probe`` is switched off; on error return ``default``."""
        if probe in self.disabled:
            return default
        try:
            return fn(*args)
        except Exception:  # the whole point: training must go on
            self.errors += 1
            n = self.failures[probe] = self.failures.get(probe, 0) + 1
            if n == 1:  # one line, no traceback: the user's stderr is theirs
                exc = sys.exc_info()[1]
                log.warning("sentinel probe %r failed (%s: %s); it records nothing this step, training "
                            "continues", probe, type(exc).__name__, str(exc)[:200])
                log.debug("sentinel probe %r failed", probe, exc_info=True)
            if n >= self.max_errors:
                self.disabled.add(probe)
                log.warning("sentinel probe %r switched off after %d errors", probe, n)
            return default
