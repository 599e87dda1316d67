"""What Slurm says about the job a command ran in: why it was ended, in words.

Slurm ends a job's tasks with SIGTERM and, ``KillWait`` seconds later, SIGKILL, both for
``scancel`` and for a job that reached its time limit; only the controller knows which. So
when a command under ``sentinel run`` dies by one of those signals inside a Slurm job, the
job's state is read from ``scontrol show job`` (well inside ``KillWait``) and the crash
message names the cause.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping

from sentinel.instrument.options import slurm_job_name

_STATES = {
    "DEADLINE": "the Slurm job reached its deadline",
    "PREEMPTED": "the Slurm job was preempted",
    "NODE_FAIL": "a node of the Slurm job failed",
    "OUT_OF_MEMORY": "the Slurm job ran out of its memory allocation",
    "BOOT_FAIL": "a node of the Slurm job failed to boot",
}


def step_task(env: Mapping[str, str]) -> bool:
    """Whether this process is a task of a Slurm step, or a task's child (``srun`` sets
    ``SLURM_JOB_ID``, ``SLURM_STEP_ID`` and ``SLURM_TASK_PID``): Slurm signals every process
    of the step itself. A process that merely inherited a step's environment (a test suite
    run by ``srun``, whose commands are no tasks of that step) is not one."""
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or ""
    return bool(env.get("SLURM_JOB_ID")) and bool(step) and env.get("SLURM_TASK_PID") in (
        str(os.getpid()), str(os.getppid()))


def job_fields(job_id: str, env: Mapping[str, str] | None = None, timeout: float = 5.0,
               tries: int = 3) -> dict[str, str]:
    """``scontrol show job -o JOB`` as ``{field: value}``; {} when it cannot be read.

    A call that reads nothing is tried again, ``tries`` times in all within ``timeout``:
    Slurm sends a time limit's SIGTERM twice, milliseconds apart, to every process of the
    step, and the second one can kill the ``scontrol`` the first one started."""
    scontrol = shutil.which("scontrol")
    if not scontrol or not job_id:
        return {}
    deadline = time.monotonic() + timeout
    for attempt in range(tries):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if attempt:
            time.sleep(min(0.2, left / 2))
        try:
            out = subprocess.run([scontrol, "show", "job", "-o", job_id], capture_output=True, text=True,
                                 timeout=max(0.1, deadline - time.monotonic()),
                                 env=dict(os.environ if env is None else env)).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        fields: dict[str, str] = {}
        for item in out.split():
            key, sep, value = item.partition("=")
            if sep and key not in fields:
                fields[key] = value
        if fields:
            return fields
    return {}


def seconds(value: str) -> float | None:
    """A Slurm duration (``[D-]HH:MM:SS``, ``MM:SS``, ``MM``) in seconds; None for
    ``UNLIMITED``, ``INVALID`` and the like."""
    days, _, rest = value.rpartition("-")
    parts = rest.split(":")
    if not (days.isdigit() or not days) or not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    nums = [int(p) for p in parts]
    if len(nums) == 1:
        nums = [0, nums[0], 0]  # a bare number is minutes
    elif len(nums) == 2:
        nums = [0, *nums]
    return (int(days or 0) * 24 + nums[0]) * 3600 + nums[1] * 60 + nums[2]


def end_reason(status: int, env: Mapping[str, str] | None = None) -> str:
    """Why Slurm ended a command that exited with ``status`` (``128 + N`` for signal N),
    e.g. ``"the Slurm job 12 was cancelled (scancel)"``; '' outside Slurm, for other
    statuses, or when the controller cannot be asked.

    While Slurm kills a job's tasks the job is ``COMPLETING`` for ``scancel`` and for the
    time limit alike; its ``Reason=TimeLimit``, or a run time at or past the limit, tells
    the time limit.
    """
    env = os.environ if env is None else env
    job = slurm_job_name(env)
    if not job or status - 128 not in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGUSR1):
        return ""
    fields = job_fields(env.get("SLURM_JOB_ID", job), env)
    state = fields.get("JobState", "").split("+")[0]
    if not state:
        return ""
    limit, ran = seconds(fields.get("TimeLimit", "")), seconds(fields.get("RunTime", ""))
    if state == "TIMEOUT" or (state in ("COMPLETING", "CANCELLED") and (
            fields.get("Reason") == "TimeLimit" or (limit is not None and ran is not None and ran >= limit))):
        return (f"the Slurm job {job} reached its time limit (TimeLimit={fields['TimeLimit']}; "
                "SIGTERM, then SIGKILL after KillWait)")
    if state in ("COMPLETING", "CANCELLED"):
        return f"the Slurm job {job} was cancelled (scancel)"
    if state in _STATES:
        return _STATES[state].replace("Slurm job", f"Slurm job {job}")
    sig = signal.Signals(status - 128).name
    return f"{sig} while the Slurm job {job} is {state} (scancel --signal, or a signal from outside Slurm)"
