"""The signals ``sentinel run`` passes on to its command, so that wrapping a script changes
nothing about how it is stopped, checkpointed or interrupted.

Without a handler, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 end the process that gets them.
Sent to ``sentinel run`` alone, they would end it, not the script: a Slurm job's
``--signal=USR1@90`` (Lightning's auto-requeue), submitit's SIGUSR2, a batch script's
``trap 'kill -USR1 $pid' USR1``, or a ``kill -HUP`` would take the job down before the
script's own handler saved anything. So each of :data:`FORWARDED` is caught for as long as
the command runs and handed on to it, once, and held off after the command ended until its
end is reported (Slurm sends its time limit's SIGTERM twice, milliseconds apart: the second
must not cut the report of the first short):

- a signal this process inherited as ignored (``nohup``'s SIGHUP) stays ignored: the
  command inherits it ignored too;
- the keys of a terminal (Ctrl-C: SIGINT, Ctrl-\\: SIGQUIT) and its hangup (SIGHUP) reach
  every process of the terminal's foreground process group: when this process and the
  command are in it, the command got its own, and a second one would interrupt the
  ``except KeyboardInterrupt:`` block where scripts save their work (the shell, waiting
  for a foreground job, does not pass them on either);
- in a task of a Slurm step, Slurm signals every process of the step itself (``scancel``,
  ``--signal``, the time limit): the command got its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import FrameType

from sentinel.slurm import step_task

FORWARDED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
"""The signals handed on to the command: those a terminal, a scheduler or an operator sends
to stop a job or to ask it to save its state."""
FROM_TERMINAL = frozenset((signal.SIGHUP, signal.SIGINT, signal.SIGQUIT))
"""Those a terminal sends to its whole foreground process group."""


@contextmanager
def forwarding(proc: subprocess.Popen[bytes], env: Mapping[str, str]) -> Iterator[None]:
    """Hand :data:`FORWARDED` on to ``proc`` while the block runs (see the module's
    docstring for when a signal is not handed on); the previous handlers come back after.

    ``proc`` is signalled by pid only while it has not been reaped (``returncode`` is
    None); a zombie ignores a signal, and its pid is not reused before the reap. After the
    reap a signal is caught and dropped until the block ends.

    Args:
        proc: the command.
        env: the environment ``sentinel run`` was started with (whether it is a Slurm
            step's task).
    """
    slurm = step_task(env)

    def forward(signum: int, frame: FrameType | None) -> None:
        if slurm or proc.returncode is not None:
            return
        if signum in FROM_TERMINAL and _terminal_reaches(proc.pid):
            return
        try:
            os.kill(proc.pid, signum)
        except OSError:
            pass

    previous = {}
    for sig in FORWARDED:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, forward)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _terminal_reaches(pid: int) -> bool:
    """Whether this process and ``pid`` are both in the foreground process group of this
    process's controlling terminal (a terminal's signal reached them both)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False  # no controlling terminal: the signal was sent to this process
    try:
        group = os.getpgrp()
        return os.tcgetpgrp(fd) == group and os.getpgid(pid) == group
    except OSError:
        return False
    finally:
        os.close(fd)
