"""Alert transitions on the console: one line on stderr for each warning and critical one.

The researcher watching a run in a terminal, and a production job's log collector reading
stderr, see ``sentinel: [FIRING] critical TrainingNonFinite — run r7, since step 200: …``
whichever process carries the engine: the child process that ``sentinel.watch`` starts
(its stderr is the training process's), the thread of ``engine="thread"``, ``sentinel run``
and ``sentinel daemon``. The line is built from the alert alone, never from a route.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TextIO

from sentinel.delivery.messages import console_line
from sentinel.rules.lifecycle import Transition

log = logging.getLogger("sentinel")

LOUD = frozenset({"warning", "critical"})
"""Severities written on stderr; the others (info: advice) go to the log at INFO."""


def _stderr() -> TextIO | None:
    return sys.stderr  # looked up per line: a redirection made after the start is followed


class AlertConsole:
    """An engine listener: each warning or critical transition that is sent (firing, and its
    resolve) becomes one line on stderr; the others, info advice and a re-fire inside the
    rule's cooldown (no route sends it either), are logged at INFO (``sentinel -v`` shows them).

    Never raises: a closed or broken stderr loses the line and counts it in :attr:`failed`.

    Args:
        enabled: False (``notify.console: false``) writes nothing on stderr; every transition
            is logged at INFO instead.
        stream: returns where a line goes, called for each line (default: the current
            ``sys.stderr``; None, as under ``pythonw``, writes nothing).
    """

    def __init__(self, enabled: bool = True, stream: Callable[[], TextIO | None] = _stderr) -> None:
        self.enabled = enabled
        self.stream = stream
        self.written = 0
        """Lines written."""
        self.failed = 0
        """Lines lost to a stderr that could not be written."""

    def __call__(self, t: Transition) -> None:
        try:
            line = console_line(t.to_json())
            if not (self.enabled and t.notify and t.severity in LOUD):
                log.info("%s", line)
                return
            out = self.stream()
            if out is None:
                return
            out.write(f"sentinel: {line}\n")
            out.flush()
            self.written += 1
        except Exception:  # never the engine's or training's problem
            self.failed += 1
