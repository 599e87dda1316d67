"""For a test script about to kill itself: wait until its engine has the step's report (the
crash message carries the last values), as ``/metrics`` shows them, instead of sleeping."""

from __future__ import annotations

import re
import time
import urllib.request


def wait_for_step(url: str, step: int, timeout: float = 30.0) -> None:
    """Until ``url``'s ``/metrics`` has ``sentinel_step`` at ``step`` (or ``timeout`` passed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            if re.search(rf"^sentinel_step{{[^}}]*}} {step}\.0$", r.read().decode(), re.M):
                return
        time.sleep(0.02)
