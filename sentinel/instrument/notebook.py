"""A notebook kernel waiting for its next cell is not a stalled training.

In Jupyter a training loop is a cell: it ends, and the kernel waits for the researcher's
next cell, for minutes or for days. No step comes and nothing of the model runs, which is
what a hang looks like from the engine: ten minutes after any cell that trained, a
critical ``TrainingStalled`` ("py-spy dump the ranks") reached the notebook and every
route. A hang keeps the kernel busy in its cell; between cells the kernel is idle, and
IPython says when: its ``post_run_cell`` and ``pre_run_cell`` events. While it is idle, a
thread of Sentinel's sends a heartbeat every ``heartbeat_seconds`` for each monitor whose
training steps in the kernel's own thread, so the stall limit counts from the next cell's
start (the status page shows such a run as *waiting*). A training that a cell started in
a thread of its own goes on between cells and is beaten by nothing here: its hang still
pages. Outside IPython nothing is installed (one ``sys.modules`` lookup per monitor).
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from typing import Any

log = logging.getLogger("sentinel")
_monitors: weakref.WeakSet[Any] = weakref.WeakSet()
_shell: weakref.ref[Any] | None = None  # the IPython shell whose events are hooked
_idle: _Idle | None = None  # the beating thread, while the kernel waits for a cell


def watch(monitor: Any) -> None:
    """Beat ``monitor`` while an IPython kernel that runs its training waits for a cell.
    Never raises."""
    try:
        if "IPython" not in sys.modules:
            return
        shell = sys.modules["IPython"].get_ipython()
        if shell is None or not hasattr(shell, "events"):
            return
        _monitors.add(monitor)
        _hook(shell)
    except Exception:
        log.debug("sentinel: could not follow the notebook's cells", exc_info=True)


def _hook(shell: Any) -> None:
    global _shell
    if _shell is not None and _shell() is shell:
        return
    shell.events.register("pre_run_cell", _cell_starts)
    shell.events.register("post_run_cell", _cell_ended)
    _shell = weakref.ref(shell)


def _cell_starts(*_: Any) -> None:
    """The kernel runs a cell: its training beats for itself, or hangs and pages."""
    global _idle
    try:
        idle, _idle = _idle, None
        if idle is not None:
            idle.stop()
    except Exception:
        log.debug("sentinel: could not stop the notebook's idle beats", exc_info=True)


def _cell_ended(*_: Any) -> None:
    """The cell is done: the kernel waits for the researcher, and the trainings of its own
    thread with it."""
    global _idle
    try:
        _cell_starts()
        _idle = _Idle(threading.get_ident())
    except Exception:
        log.debug("sentinel: could not start the notebook's idle beats", exc_info=True)


class _Idle:
    """A daemon thread beating the monitors that train in ``kernel`` (a thread ident)
    until :meth:`stop`."""

    def __init__(self, kernel: int) -> None:
        self.kernel = kernel
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sentinel-notebook-idle", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating; returns once no beat is being sent (a cell's code runs after it)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _mine(self) -> list[Any]:
        """The open monitors that train in the kernel's thread; held only while beating (a
        list kept over the wait kept a dropped model and its optimizer alive)."""
        return [m for m in list(_monitors) if m.stepped_in == self.kernel and m.active and not m.closed]

    def _run(self) -> None:
        while True:
            try:
                every = min((float(m.options.heartbeat_seconds) for m in self._mine()), default=20.0)
            except Exception:  # nothing of Sentinel's reaches the notebook's output
                log.debug("sentinel: the notebook's idle beats failed", exc_info=True)
                every = 20.0
            if self._stop.wait(every / 2):  # twice per interval: the engine never sees a gap of one
                return
            try:
                self._beat()
            except Exception:
                log.debug("sentinel: the notebook's idle beats failed", exc_info=True)

    def _beat(self) -> None:  # a function's locals: no monitor is left referenced over the wait
        for m in self._mine():
            m.idle_beat()
