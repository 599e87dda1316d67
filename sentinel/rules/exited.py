"""``exited``: a rank's process ended without finishing (non-zero status, a signal, gone).

The engine writes ``sentinel_exit_status`` for a rank when it learns that its process
ended before saying goodbye: from ``sentinel run``, which waits for the command, or from
its own check that a reporting process still exists. The value is the exit code, ``128 +
N`` for death by signal ``N`` (as a shell reports it), ``-1`` when the process vanished
and its status is unknown, or ``-2`` (:data:`THREAD_FAILED`) when the thread the training
ran in ended on an exception and the process went on; a rank that reports again writes 0.

The detector turns that number into words, and appends ``ctx.note``: the rank's last
values, which the engine gathers when it records the exit.
"""

from __future__ import annotations

import signal

from sentinel.rules.base import Context, Params, Verdict
from sentinel.store import Window

_HINTS = {
    signal.SIGKILL: "the kernel's OOM killer sends this (check dmesg, or the container's OOMKilled state)",
    signal.SIGSEGV: "a crash in native code (a CUDA/NCCL library, a custom extension)",
    signal.SIGBUS: "a crash in native code, often shared memory (/dev/shm) running out",
    signal.SIGABRT: "an abort, e.g. a failed assertion or an NCCL watchdog timeout",
    signal.SIGTERM: "the scheduler or launcher terminated it (preemption, a time limit, another rank's failure)",
    signal.SIGINT: "interrupted: Ctrl-C in its terminal, or a kill -INT (rules.TrainingCrashed.params.ignore_codes: [130] keeps it quiet)",
    signal.SIGHUP: "its terminal closed (run it under nohup, tmux or a batch system)",
}


THREAD_FAILED = -2
"""``sentinel_exit_status`` of a rank whose training thread ended on an uncaught exception
while its process went on (a web UI's or a server's training thread): no exit status yet."""


class ExitedParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        ignore_codes: exit statuses that are not crashes (e.g. a planned early exit).
    """

    ignore_codes: list[int] = []


def describe(status: int) -> str:
    """Words for an exit status as the engine records it."""
    if status == THREAD_FAILED:
        return "its training thread ended on an uncaught exception, the process going on"
    if status < 0:
        return "its process is gone without finishing (exit status unknown)"
    if status > 128:
        try:
            sig = signal.Signals(status - 128)
        except ValueError:
            return f"exited with status {status}"
        hint = _HINTS.get(sig)
        return f"was killed by {sig.name} (signal {sig.value})" + (f": {hint}" if hint else "")
    return f"exited with status {status}"


def detect(window: Window, params: ExitedParams, ctx: Context) -> Verdict | None:
    """Fire for a recorded non-zero exit status; a 0 (the rank reported again) resolves."""
    if len(window) == 0:
        return None
    status = int(window.values[-1])
    firing = status != 0 and status not in params.ignore_codes
    detail = describe(status) if firing else "running again"
    if firing and ctx.note:
        detail += f"; {ctx.note}"
    return Verdict(firing, float(status), 0.0, detail=detail)
