"""The meeting of a Slurm step's tasks on a node (sentinel/nodeshare.py), without Slurm:
real processes racing for the real folder's locks, with the environment srun gives them.
tests/integration/test_slurm.py runs it under a real srun."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sentinel import nodeshare
from sentinel.nodeshare import claim, local_tasks, step_folder


def _env(job: str, local: int, tasks: int) -> dict[str, str]:
    return {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "n1", "SLURM_LOCALID": str(local),
            "SLURM_STEP_TASKS_PER_NODE": str(tasks), "SLURM_NODEID": "0", "SLURM_TASK_PID": str(os.getpid())}


def _task(job: str, local: int, tasks: int, status: int, go: Any, out: Any) -> None:
    """One task: claim; the starter binds a socket (the daemon) and waits for the others."""
    go.wait()
    share = claim(_env(job, local, tasks), timeout=30)
    assert share is not None
    if share.starter:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(share.socket_path)
        share.publish(f"http://daemon-of-{local}")
        time.sleep(0.3)  # its own rank
        others = share.wait_for_others(join_seconds=30)
        out.put(("starter", local, sorted(others), time.monotonic()))
        sock.close()
        os.unlink(share.socket_path)
        share.close()
    else:
        out.put(("attached", local, share.url, time.monotonic()))
        time.sleep(1.0)  # its rank outlives the starter's
        share.leave(status)


@pytest.mark.parametrize("tasks", [1, 4])
def test_one_starter_per_node_the_others_attach_and_it_ends_after_them(tasks: int) -> None:
    job = f"t{uuid.uuid4().hex[:8]}"
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_task, args=(job, i, tasks, 10 + i, go, out)) for i in range(tasks)]
    for p in procs:
        p.start()
    go.set()  # all at once: a race for the lock
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * tasks
    got = [out.get(timeout=5) for _ in range(tasks)]
    [starter] = [g for g in got if g[0] == "starter"]
    attached = [g for g in got if g[0] == "attached"]
    assert len(attached) == tasks - 1
    assert {g[2] for g in attached} <= {f"http://daemon-of-{starter[1]}"}
    # the starter got every other task's status, after they had all left
    assert starter[2] == sorted(10 + g[1] for g in attached)
    folder = step_folder({**_env(job, 0, tasks), "SLURM_TASK_PID": str(os.getpid())})
    assert folder is not None and not os.path.exists(folder)


def test_a_starter_that_died_before_its_daemon_is_replaced(tmp_path: Path) -> None:
    job = f"t{uuid.uuid4().hex[:8]}"
    ctx = mp.get_context("fork")

    def die_holding_the_lock() -> None:
        share = claim(_env(job, 0, 2), timeout=10)
        assert share is not None and share.starter
        os._exit(9)  # SIGKILL-like: no cleanup, the kernel drops the lock

    p = ctx.Process(target=die_holding_the_lock)
    p.start()
    p.join(30)
    share = claim(_env(job, 1, 2), timeout=10)
    assert share is not None and share.starter  # took over in the same folder
    share.close()


def test_outside_a_step_or_in_a_grandchild_of_a_task_there_is_no_meeting() -> None:
    env = _env("12", 0, 2)
    assert step_folder(env) is not None and step_folder(env).startswith("/tmp/sentinel-")  # type: ignore[union-attr]
    assert step_folder({k: v for k, v in env.items() if k != "SLURM_STEP_ID"}) is None  # the batch script itself
    assert step_folder({**env, "SLURM_TASK_PID": "1"}) is None  # e.g. a test suite under srun


@pytest.mark.parametrize(("spec", "node", "n"), [("2", "0", 2), ("2(x3),1", "2", 2), ("2(x3),1", "3", 1),
                                                 ("8", "0", 8), ("", "0", 1), ("garbage", "0", 1)])
def test_local_tasks_from_slurm_step_tasks_per_node(spec: str, node: str, n: int) -> None:
    assert local_tasks({"SLURM_STEP_TASKS_PER_NODE": spec, "SLURM_NODEID": node}) == n


def test_a_folder_of_another_kind_is_refused(tmp_path: Path) -> None:
    job = f"t{uuid.uuid4().hex[:8]}"
    folder = step_folder(_env(job, 0, 2))
    assert folder is not None
    os.symlink(tmp_path, folder)  # planted: never followed
    try:
        assert claim(_env(job, 0, 2), timeout=2) is None
    finally:
        os.unlink(folder)
    assert nodeshare.SOCKET == "engine.sock"
