"""What Slurm says about the job a command ran in: why it was ended, in words.

Slurm ends a job's tasks with SIGTERM and, ``KillWait`` seconds later, SIGKILL, both for
``scancel`` and for a job that reached its time limit; only the controller knows which. So
when a command under ``sentinel run`` dies by one of those signals inside a Slurm job, the
job's state is read from ``scontrol show job`` (a few milliseconds, well inside
``KillWait``) and the crash message names the cause.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping

from sentinel.instrument.options import slurm_job_name

_STATES = {
    "CANCELLED": "the Slurm job was cancelled (scancel)",
    "TIMEOUT": "the Slurm job reached its time limit",
    "DEADLINE": "the Slurm job reached its deadline",
    "PREEMPTED": "the Slurm job was preempted",
    "NODE_FAIL": "a node of the Slurm job failed",
    "OUT_OF_MEMORY": "the Slurm job ran out of its memory allocation",
    "BOOT_FAIL": "a node of the Slurm job failed to boot",
}


def job_fields(job_id: str, env: Mapping[str, str] | None = None, timeout: float = 5.0) -> dict[str, str]:
    """``scontrol show job -o JOB`` as ``{field: value}``; {} when it cannot be read."""
    scontrol = shutil.which("scontrol")
    if not scontrol or not job_id:
        return {}
    try:
        out = subprocess.run([scontrol, "show", "job", "-o", job_id], capture_output=True, text=True,
                             timeout=timeout, env=dict(os.environ if env is None else env)).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    fields: dict[str, str] = {}
    for item in out.split():
        key, sep, value = item.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def end_reason(status: int, env: Mapping[str, str] | None = None) -> str:
    """Why Slurm ended a command that exited with ``status`` (``128 + N`` for signal N),
    e.g. ``"the Slurm job 12 was cancelled (scancel)"``; '' outside Slurm, for other
    statuses, or when the controller says nothing that explains it."""
    env = os.environ if env is None else env
    job = slurm_job_name(env)
    if not job or status - 128 not in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGUSR1):
        return ""
    fields = job_fields(env.get("SLURM_JOB_ID", job), env)
    state = fields.get("JobState", "").split("+")[0]
    words = _STATES.get(state)
    if words is None:
        return ""
    words = words.replace("Slurm job", f"Slurm job {job}")
    if state == "TIMEOUT" and fields.get("TimeLimit"):
        words += f" (TimeLimit={fields['TimeLimit']}; SIGTERM, then SIGKILL after KillWait)"
    return words
