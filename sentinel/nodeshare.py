"""One daemon per node for the tasks of a Slurm step: ``srun -n 8 sentinel run -- CMD``.

Every task of the step runs ``sentinel run``. On each node the step's tasks meet in one
private folder named by the user, the job, the step and the node
(``/tmp/sentinel-<uid>-slurm-<job>.<step>-<node>``, 0700, made and checked by
:func:`sentinel.daemon.folder.private_folder`):

- the task that wins an exclusive ``flock`` on ``elect`` there is the **starter**: it
  starts the daemon (its socket ``engine.sock`` in that folder), writes the daemon's URL to
  ``url`` (atomically: the sign that the socket is live), and runs its own CMD;
- every other task holds a shared ``flock`` on ``users`` while it runs CMD attached to that
  daemon (:func:`sentinel.attach.run_attached`), and writes CMD's exit status to
  ``task.<SLURM_LOCALID>`` before it lets go;
- the starter, once its own CMD has exited, waits until the node's other tasks
  (``SLURM_STEP_TASKS_PER_NODE``) have joined, then takes ``users`` exclusively: every
  attached task is gone, by exit or by death, for the kernel drops a dead process's locks.
  It then records the run's end with the highest status of the node's tasks (what ``srun``
  reports), stops the daemon and removes the folder.

Nothing stale can block a later task: a starter killed by SIGKILL holds no lock, so the
next task to try ``elect`` takes over in the same folder; one that finished unlinked the
lock files before letting go of them, and a task that locked such an unlinked file sees
it (the inode is no longer the folder's) and starts over.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from sentinel.attach import listening
from sentinel.daemon.folder import UnsafeFolder, private_folder
from sentinel.slurm import step_task

log = logging.getLogger("sentinel")

SOCKET = "engine.sock"
_MAX_UNIX_PATH = 107  # sun_path holds 108 bytes, the last a NUL


def step_folder(env: Mapping[str, str]) -> str | None:
    """The node's meeting folder of this Slurm step, or None: outside a step (``srun``
    sets ``SLURM_JOB_ID`` and ``SLURM_STEP_ID``), in a process that is neither a task of
    the step nor a task's child (``SLURM_TASK_PID``: e.g. a test suite run by ``srun``,
    whose ``sentinel run`` commands are no ranks of that step), or where the socket path would be
    too long.

    The folder is in ``/tmp``, not ``$TMPDIR``: slurmstepd (22.05) sets ``TMPDIR`` for a
    node's first task only, so the tasks of one node would not meet there."""
    if not step_task(env):
        return None
    job = env["SLURM_JOB_ID"]
    step = env.get("SLURM_STEP_ID") or env["SLURM_STEPID"]
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"sentinel-{os.getuid()}-slurm-{job}.{step}-{node}")[:80]
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    folder = os.path.join(base, name)
    return folder if len(os.path.join(folder, SOCKET).encode()) <= _MAX_UNIX_PATH else None


def local_tasks(env: Mapping[str, str]) -> int:
    """How many tasks of this step run on this node: ``SLURM_STEP_TASKS_PER_NODE`` (e.g.
    ``2(x3),1``) at ``SLURM_NODEID``; 1 when it cannot be read."""
    spec, node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", ""), env.get("SLURM_NODEID", "0")
    if not node.isdigit():
        return 1
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return 1
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[int(node)] if int(node) < len(counts) else 1


@dataclass(eq=False)
class NodeShare:
    """This task's place in the node's meeting folder (see the module's docstring).

    ``starter``: this task starts the daemon (:meth:`publish`, :meth:`wait_for_others`,
    :meth:`close`); else it attaches to the daemon at ``socket_path`` (URL ``url``) and
    calls :meth:`leave` with its exit status."""

    folder: str
    starter: bool
    expected: int
    task: str
    url: str = ""
    _fds: dict[str, int] = field(default_factory=dict)

    @property
    def socket_path(self) -> str:
        return os.path.join(self.folder, SOCKET)

    def publish(self, url: str) -> None:
        """(starter) The daemon listens: tell the waiting tasks where."""
        self.url = url
        _write(self._fds["dir"], "url", url)

    def wait_for_others(self, join_seconds: float = 60.0) -> list[int]:
        """(starter, after its CMD's exit) Block until every other task of the node has
        joined (at most ``join_seconds``) and ended; their exit statuses."""
        d = self._fds["dir"]
        deadline = time.monotonic() + join_seconds
        while len(_tasks(d)) < self.expected - 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        fcntl.flock(self._fds["users"], fcntl.LOCK_EX)  # retried across signals (PEP 475)
        out = []
        for name in _tasks(d):
            text = _read(d, name)
            if text is not None and text.strip().isdigit():
                out.append(int(text))
        return out

    def leave(self, status: int) -> None:
        """(attached task) Record this task's exit status for the starter, and let go."""
        try:
            _write(self._fds["dir"], f"task.{self.task}", str(status))
        except OSError:
            pass
        self._close_fds()

    def close(self) -> None:
        """(starter, after the daemon stopped) Remove the folder, then let go of the locks:
        a task that locks an unlinked file then sees it is stale."""
        d = self._fds.get("dir")
        if d is not None:
            for name in ["url", *_tasks(d), "users", "elect"]:
                try:
                    os.unlink(name, dir_fd=d)
                except OSError:
                    pass
            try:
                os.rmdir(self.folder)
            except OSError:  # a late task's file, or the daemon's socket: left for the last one
                pass
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def claim(env: Mapping[str, str], timeout: float = 60.0) -> NodeShare | None:
    """This task's :class:`NodeShare` in a Slurm step; None outside one, when the folder is
    not ours (a line on stderr says so), or when no daemon came up within ``timeout``
    seconds (``sentinel run`` then starts one of its own, as outside Slurm)."""
    folder = step_folder(env)
    if folder is None:
        return None
    task = env.get("SLURM_LOCALID", "")
    task = task if task.isdigit() else f"pid{os.getpid()}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            share = _try_claim(folder, task, local_tasks(env), deadline)
        except UnsafeFolder as exc:
            log.warning("sentinel: %s; this task starts a daemon of its own", exc)
            return None
        except OSError as exc:  # the folder went away under us (a starter cleaning up): again
            if exc.errno not in (errno.ENOENT, errno.ESTALE):
                log.warning("sentinel: cannot share the node's daemon in %s: %s", folder, exc)
                return None
            continue
        if share is not None:
            return share
    log.warning("sentinel: no daemon came up in %s within %.0f s; this task starts one of its own", folder, timeout)
    return None


def _try_claim(folder: str, task: str, expected: int, deadline: float) -> NodeShare | None:
    """One attempt; None to start over (a stale lock file, or no daemon before ``deadline``)."""
    private_folder(folder)
    fds: dict[str, int] = {}
    share = NodeShare(folder, False, expected, task, _fds=fds)
    try:
        fds["dir"] = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        for name in ("elect", "users"):
            fds[name] = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fds["dir"])
        if _lock(fds["elect"], fcntl.LOCK_EX | fcntl.LOCK_NB):
            return _as_starter(share)
        fcntl.flock(fds["users"], fcntl.LOCK_SH)  # blocks only while a starter ends
        if not _current(share, "users"):
            share._close_fds()
            return None
        _write(fds["dir"], f"task.{task}", "")  # joined: the starter waits for it
        while time.monotonic() < deadline:
            url = _read(fds["dir"], "url")
            if url and listening(share.socket_path):
                share.url = url
                return share
            if _lock(fds["elect"], fcntl.LOCK_EX | fcntl.LOCK_NB):  # the starter died before its daemon
                _unlink(fds["dir"], f"task.{task}")
                fcntl.flock(fds["users"], fcntl.LOCK_UN)
                return _as_starter(share)
            time.sleep(0.05)
        _unlink(fds["dir"], f"task.{task}")
        share._close_fds()
        return None
    except BaseException:
        share._close_fds()
        raise


def _as_starter(share: NodeShare) -> NodeShare | None:
    if not _current(share, "elect"):  # locked a file a finished starter had unlinked
        share._close_fds()
        return None
    _unlink(share._fds["dir"], "url")  # of a starter that died
    share.starter = True
    return share


def _current(share: NodeShare, name: str) -> bool:
    """Whether the file locked as ``name`` is still the folder's, and the folder the path's."""
    try:
        here = os.stat(name, dir_fd=share._fds["dir"], follow_symlinks=False)
        d = os.lstat(share.folder)
    except OSError:
        return False
    mine, my_dir = os.fstat(share._fds[name]), os.fstat(share._fds["dir"])
    return (here.st_ino, here.st_dev) == (mine.st_ino, mine.st_dev) and \
        (d.st_ino, d.st_dev) == (my_dir.st_ino, my_dir.st_dev)


def _lock(fd: int, how: int) -> bool:
    try:
        fcntl.flock(fd, how)
        return True
    except BlockingIOError:
        return False


def _tasks(d: int) -> list[str]:
    try:
        return sorted(n for n in os.listdir(d) if n.startswith("task."))
    except OSError:
        return []


def _read(d: int, name: str) -> str | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, 4096).decode(errors="replace")
    finally:
        os.close(fd)


def _write(d: int, name: str, text: str) -> None:
    """Replace ``name`` in the folder with ``text``, atomically (a reader sees all or none)."""
    tmp = f".{name}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=d, dst_dir_fd=d)


def _unlink(d: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=d)
    except OSError:
        pass
