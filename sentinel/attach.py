"""``sentinel run -- CMD`` attached to a node's daemon: one daemon for all the ranks of a node.

Under Slurm, ``srun -n 8 sentinel run -- python train.py`` starts one daemon per node,
and the node's other tasks attach to it (:mod:`sentinel.nodeshare`). When
``SENTINEL_SOCKET`` names the socket of a daemon that is listening (``sentinel daemon`` started by the batch script or a
prolog, the sidecar of a pod, the systemd unit), ``sentinel run`` starts none: CMD is
instrumented to report to that daemon, and when CMD exits non-zero the exit status and
its reason in words (``scancel``, the time limit: :mod:`sentinel.slurm`) go to the daemon
in a ``bye`` frame for this task's rank, so ``TrainingCrashed`` says why.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Mapping

from sentinel import wire
from sentinel.instrument.options import default_run_name
from sentinel.signals import forwarding


def attached_socket(env: Mapping[str, str]) -> str | None:
    """``SENTINEL_SOCKET`` if a daemon listens on it, else None (``sentinel run`` then
    starts its own). A path that is not a socket, or one nobody reads, is not used.

    ``SENTINEL_SOCKET_WAIT`` (seconds, default 0): wait up to that long for a daemon to
    listen there. The batch script sets it: its daemons start alongside the job's tasks,
    and on a node whose daemon comes up late (a slow import from a shared file system) a
    task would otherwise start a second daemon there. A socket file that a killed daemon
    left behind is waited through too, until the new daemon binds it afresh."""
    path = env.get("SENTINEL_SOCKET")
    if not path:
        return None
    wait = _seconds(env.get("SENTINEL_SOCKET_WAIT", ""), "SENTINEL_SOCKET_WAIT")
    deadline = time.monotonic() + wait
    while not listening(path):
        if time.monotonic() >= deadline:
            if wait:
                print(f"sentinel: no daemon listens on SENTINEL_SOCKET={path} after {wait:g} s; "
                      "this task starts one of its own", file=sys.stderr)
            return None
        time.sleep(0.1)
    return path


def listening(path: str) -> bool:
    """Whether ``path`` is a socket a daemon reads (one left behind by a dead daemon is not)."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return False
    except OSError:
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK, errno.EACCES):
            return False
        raise
    finally:
        probe.close()
    return True


def _seconds(text: str, name: str) -> float:
    """``text`` as a number of seconds ≥ 0; an empty or bad value is 0, with a line on stderr for a bad one."""
    try:
        value = float(text) if text.strip() else 0.0
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        print(f"sentinel: {name}={text!r} is not a number of seconds; not waiting", file=sys.stderr)
        return 0.0
    return value


def task_rank(env: Mapping[str, str]) -> tuple[int, int]:
    """This task's ``(rank, world)`` from the launcher (``RANK``, else ``SLURM_PROCID``)."""
    for rk, ws in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if env.get(rk, "").isdigit():
            world = env.get(ws, "1")
            return int(env[rk]), int(world) if world.isdigit() else 1
    return 0, 1


def run_attached(cmd: list[str], socket_path: str, tags: dict[str, str], url: str | None = None) -> int:
    """Run ``cmd`` instrumented to the daemon at ``socket_path`` (its address ``url``, else
    ``SENTINEL_URL``); return its exit status (128 + N for signal N). The signals that stop
    or checkpoint a job are handed on to it (:mod:`sentinel.signals`)."""
    from sentinel.run import child_env

    env = child_env(socket_path, url or os.environ.get("SENTINEL_URL", ""), tags=tags, cmd=cmd)
    if not env.get("SENTINEL_URL"):
        del env["SENTINEL_URL"]
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        print(f"sentinel: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127

    # caught until the exit is reported, not only while CMD runs: Slurm sends its time
    # limit's SIGTERM twice, milliseconds apart, and a second one that found the default
    # action back would end this process before its report (the daemon would see CMD gone,
    # the reason unsaid)
    with forwarding(proc, os.environ):
        # the status without reaping: until the bye frame is sent CMD stays a zombie, which
        # the daemon counts as alive, so its own "process gone" verdict cannot come first
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        if info is None:  # cannot happen without WNOHANG; read it from the reap instead
            rc = proc.wait()
            status = 128 - rc if rc < 0 else rc
        else:
            status = info.si_status if info.si_code == os.CLD_EXITED else 128 + info.si_status
        try:
            _report(status, cmd, proc.pid, env, socket_path)
        finally:
            proc.wait()
    return status


def _report(status: int, cmd: list[str], pid: int, env: dict[str, str], socket_path: str) -> None:
    """Send a non-zero exit of ``cmd`` to the daemon, with the reason in words."""
    from sentinel.slurm import end_reason

    if status:
        reason = end_reason(status, env)
        who = f"{os.path.basename(cmd[0])} (pid {pid})" + (f" ({reason})" if reason else "")
        rank, world = task_rank(env)
        frame = wire.Frame(kind="bye", job=env.get("SENTINEL_JOB") or "train",
                           run=env.get("SENTINEL_RUN") or default_run_name(), rank=rank, world=world, step=0,
                           t=time.time(), status=min(status, 255), exc=who[:200])
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            try:
                s.sendto(wire.encode(frame), socket_path)
            except OSError as exc:  # the daemon went away meanwhile: say so, never fail CMD's status
                print(f"sentinel: could not report the exit to {socket_path}: {exc.strerror}", file=sys.stderr)
        if reason:
            print(f"sentinel: {who} exited with status {status}", file=sys.stderr)
