"""The console listener: which transitions become a line on stderr, and what the line says."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable

import pytest

from sentinel.daemon.console import AlertConsole
from sentinel.delivery.messages import title
from sentinel.rules.alert import Transition


def _t(severity: str = "critical", to: str = "firing", notify: bool = True,
       summary: str = "Non-finite loss at step 200 on rank 0") -> Transition:
    return Transition("TrainingNonFinite", severity, "pending" if to == "firing" else "firing", to, "train", "r7",
                      (0,), (), 230, 1000.0, float("nan"), 0.0, summary, (), (), "", notify=notify,
                      started_step=200, started_at=990.0)


@pytest.mark.parametrize(("severity", "to", "notify", "enabled", "line"), [
    ("critical", "firing", True, True,
     "sentinel: [FIRING] critical TrainingNonFinite — run r7, since step 200: Non-finite loss at step 200 on rank 0\n"),
    ("warning", "firing", True, True,
     "sentinel: [FIRING] warning TrainingNonFinite — run r7, since step 200: Non-finite loss at step 200 on rank 0\n"),
    ("critical", "resolved", True, True,
     "sentinel: [RESOLVED] critical TrainingNonFinite — run r7, since step 200: Non-finite loss at step 200 on rank 0\n"),
    ("info", "firing", True, True, ""),        # advice: the log at INFO
    ("critical", "firing", False, True, ""),   # a re-fire inside the cooldown: no route sends it either
    ("critical", "firing", True, False, ""),   # notify.console: false
])
def test_which_transitions_are_a_line(severity: str, to: str, notify: bool, enabled: bool, line: str,
                                      caplog: pytest.LogCaptureFixture) -> None:
    err = io.StringIO()
    console = AlertConsole(enabled, stream=lambda: err)
    with caplog.at_level(logging.INFO, logger="sentinel"):
        console(_t(severity, to, notify))
    assert err.getvalue() == line
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    # exactly one place: stderr, or the log at INFO
    assert logged == ([] if line else [title(_t(severity, to, notify).to_json())
                                       + ": Non-finite loss at step 200 on rank 0"])


def test_a_summary_over_several_lines_is_one_line() -> None:
    err = io.StringIO()
    AlertConsole(stream=lambda: err)(_t(summary="Training crashed on rank 0 at step 5:\n  exited with status 1"))
    assert err.getvalue().count("\n") == 1 and "step 5: exited with status 1\n" in err.getvalue()


def _closed() -> io.StringIO:
    s = io.StringIO()
    s.close()
    return s


@pytest.mark.parametrize(("stream", "failed"), [(lambda: None, 0), (_closed, 1)])  # pythonw; a closed stderr
def test_a_missing_or_broken_stderr_loses_the_line_and_raises_nothing(stream: Callable[[], io.StringIO | None],
                                                                      failed: int) -> None:
    console = AlertConsole(stream=stream)
    console(_t())
    assert (console.written, console.failed) == (0, failed)
