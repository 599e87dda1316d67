"""Sentinel under a real Slurm (Debian's slurm-wlm and munge): a one-node cluster the tests
start themselves (tests/slurm.py). ``srun -n 2 sentinel run -- python train.py`` reports
both tasks to the node's one daemon (one the tasks start themselves, or one already
running), the run is named from the job id (an array task:
``ID_INDEX``) with the job id, step id and node name as labels on the run and its alerts;
``deploy/slurm/sentinel.sbatch`` starts that daemon itself; ``scancel`` and the time limit
reach ``TrainingCrashed`` with the reason in words."""

from __future__ import annotations

import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.history.query import find_run
from tests.helpers import Receiver, end_process, wait_for, write_config
from tests.slurm import SlurmCluster, why_not

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"
SBATCH = ROOT / "deploy" / "slurm" / "sentinel.sbatch"
SENTINEL = f"{sys.executable} -m sentinel.cli"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), kill_wait=8)
    try:
        cluster.start()
    except RuntimeError as exc:
        pytest.skip(f"Slurm cannot start here: {str(exc).splitlines()[0][:200]}")
    cluster.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    yield cluster
    cluster.stop()


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return r.read().decode()


def _node_daemon(slurm: SlurmCluster, tmp: Path, config: str | None = None) -> tuple[subprocess.Popen[str], str, str]:
    """`sentinel daemon` on this node, as a prolog or the systemd unit would run it."""
    sock = tmp / "node" / "engine.sock"
    cmd = [sys.executable, "-m", "sentinel.cli", "daemon", "--listen", "127.0.0.1:0", "--socket", str(sock)]
    proc = subprocess.Popen(cmd + (["--config", config] if config else []), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=slurm.env)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    m = re.search(r"SENTINEL_SOCKET=(\S+) SENTINEL_URL=(\S+)", line)
    assert m, line
    return proc, m.group(1), m.group(2)


def test_srun_tasks_report_to_the_nodes_one_daemon_named_and_labelled_by_the_job(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    release = tmp_path / "release"
    release.touch()
    daemon, sock, url = _node_daemon(slurm, tmp_path)
    try:
        env = {**slurm.env, "SENTINEL_SOCKET": sock, "SENTINEL_URL": url}
        out = subprocess.run(["srun", "-n", "2", *SENTINEL.split(), "run", "--", sys.executable,
                              str(SCRIPTS / "plain_train.py"), "20", str(release)],
                             env=env, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr
        assert "metrics at" not in out.stderr  # no task started a daemon of its own
        def both() -> str | None:
            t = _metrics(url)
            return t if len(re.findall(r"sentinel_step\{.*\} 20\.0", t)) == 2 else None

        text = wait_for(both, timeout=30, what="both tasks' step 20 on the node's daemon")
        ranks = dict(re.findall(r'sentinel_step\{job="train",rank="(\d)",run="([^"]+)"\} 20\.0', text))
        assert set(ranks) == {"0", "1"} and ranks["0"] == ranks["1"]  # ranks from SLURM_PROCID, one run
        job = ranks["0"]
        assert job.isdigit() and f"JobId={job} " in slurm.command("scontrol", "show", "job", job).stdout
        info = re.search(r"sentinel_run_info\{([^}]*)\} 1\.0", text)
        assert info is not None
        assert {"slurm_job": job, "slurm_step": "0", "slurm_node": slurm.node}.items() <= \
            dict(re.findall(r'(\w+)="([^"]*)"', info.group(1))).items()
    finally:
        end_process(daemon)


# 20 steps, "trained", then it waits for the release file; the task of SLURM_PROCID 1 exits
# with the status given (the job's, as srun reports the highest of its tasks')
_TRAIN_THEN_EXIT = """
import os, sys, time, torch
from torch import nn
release, status = sys.argv[1], int(sys.argv[2])
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(20):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
print("trained", flush=True)
deadline = time.monotonic() + 240
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(status if os.environ["SLURM_PROCID"] == "1" else 0)
"""


@pytest.mark.parametrize("status", [0, pytest.param(3, marks=pytest.mark.slow)])
def test_srun_with_no_daemon_starts_one_for_the_nodes_tasks_until_the_last_ends(
        slurm: SlurmCluster, tmp_path: Path, status: int) -> None:
    release = tmp_path / "release"
    db = tmp_path / "history.sqlite"
    config = write_config(tmp_path, history={"path": str(db)})
    started = time.time() - 1
    env = {k: v for k, v in slurm.env.items() if k not in ("SENTINEL_SOCKET", "SENTINEL_URL")}
    proc = subprocess.Popen(["srun", "-n", "2", *SENTINEL.split(), "run", "--config", config, "--listen",
                             "127.0.0.1:0", "--", sys.executable, "-c", _TRAIN_THEN_EXIT, str(release), str(status)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        url = wait_for(lambda: next((m.group(1) for line in list(err)
                                     if (m := re.search(r"metrics at (http://127\.0\.0\.1:\d+)/metrics", line))), None),
                       timeout=120, what="the daemon's address")

        def both() -> str | None:
            t = _metrics(url)
            return t if len(re.findall(r"sentinel_step\{.*\} 20\.0", t)) == 2 else None

        text = wait_for(both, timeout=120, what="both tasks' step 20 on one daemon\n" + "".join(err))
        ranks = dict(re.findall(r'sentinel_step\{job="train",rank="(\d)",run="([^"]+)"\} 20\.0', text))
        assert set(ranks) == {"0", "1"} and ranks["0"] == ranks["1"]
        job = ranks["0"]
        release.touch()
        proc.wait(timeout=120)
    finally:
        release.touch()
        end_process(proc)
    reader.join(10)
    log = "".join(err)
    assert proc.returncode == status, log  # srun's status: the job's
    assert log.count("metrics at") == 1, log  # one daemon for both tasks of the node
    assert "starts one of its own" not in log and "starts a daemon of its own" not in log, log
    run = wait_for(lambda: find_run(sqlite3.connect(db), job), timeout=30, what="the job's run in the history")
    assert run.ranks == 2 and run.exit_status == status, (run, log)
    assert run.state == ("finished" if status == 0 else "crashed"), (run, log)
    assert run.tags.get("slurm_job") == job and run.tags.get("slurm_node") == slurm.node
    left = [f for f in Path("/tmp").glob(f"sentinel-{os.getuid()}-slurm-{job}.*") if f.stat().st_mtime >= started]
    assert not left  # the folder is removed


def _sbatch(slurm: SlurmCluster, tmp: Path, config: str, *args: str, wait: bool = True,
            script: list[str] | None = None) -> tuple[str, Path]:
    out = tmp / "job.out"
    env = {**slurm.env, "SENTINEL": SENTINEL, "SENTINEL_CONFIG": config, "SENTINEL_LISTEN": "127.0.0.1:0",
           "SENTINEL_DRAIN": "5"}
    env.pop("SENTINEL_SOCKET", None)
    cmd = ["sbatch", "--parsable", "-n", "2", f"--output={out}", *(["--wait"] if wait else []), *args, str(SBATCH),
           *(script or [])]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.stdout.strip(), res.stderr + (out.read_text() if out.exists() else "")
    return res.stdout.strip().split(";")[0], out


def test_sbatch_script_starts_one_daemon_for_the_array_tasks_ranks(slurm: SlurmCluster, tmp_path: Path) -> None:
    release = tmp_path / "release"  # touched once both ranks trained: they end together, as one run
    db = tmp_path / "history.sqlite"
    config = write_config(tmp_path, history={"path": str(db)})
    job, out = _sbatch(slurm, tmp_path, config, "--array=3", wait=False,
                       script=[sys.executable, str(SCRIPTS / "plain_train.py"), "15", str(release)])
    try:
        wait_for(lambda: out.exists() and out.read_text().count("trained") == 2, timeout=120, what="both ranks trained")
        release.touch()
        wait_for(lambda: not slurm.command("squeue", "-h", "-j", job).stdout.strip(), timeout=60,
                 what="the job's end\n" + out.read_text())
    finally:
        slurm.command("scancel", job)
    log = out.read_text()
    assert log.count("sentinel daemon: export SENTINEL_SOCKET=") == 1, log  # one daemon for both ranks
    assert "metrics at http://127.0.0.1:9400" not in log, log  # and no task started one of its own
    assert log.count("trained") == 2, log
    # the daemons are stopped with SIGTERM (their step signalled), not SIGKILLed by their srun:
    # they drain, and remove their socket and its folder
    assert "stopping the node daemons (step " in log and "Killed" not in log, log
    assert re.search(r"STEP \d+\.0 ON \S+ CANCELLED", log), log  # Slurm's word for it (docs/deployment.md)
    assert not Path(f"/tmp/sentinel-job-{job}").exists(), log
    run = wait_for(lambda: find_run(sqlite3.connect(db), f"{job}_3"), timeout=30, what="the array task's run")
    assert run.ranks == 2 and run.tags.get("slurm_job") == f"{job}_3" and run.tags.get("slurm_node") == slurm.node


def test_sbatch_script_waits_through_a_socket_a_killed_daemon_left(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A daemon SIGKILLed after ``KillWait`` leaves its socket file: the script's own check sees
    a socket at once, and the tasks must wait for the new daemon, not start one each. The
    job's exit status is its command's (one task exits 3), whatever the script's own exit does."""
    release = tmp_path / "release"
    release.touch()
    db = tmp_path / "history.sqlite"
    config = write_config(tmp_path, history={"path": str(db)})
    job, out = _sbatch(slurm, tmp_path, config, "--hold", wait=False,
                       script=[sys.executable, "-c", _TRAIN_THEN_EXIT, str(release), "3"])
    folder = Path(f"/tmp/sentinel-job-{job}")
    try:
        folder.mkdir(mode=0o700)
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        stale.bind(str(folder / "engine.sock"))
        stale.close()  # the file stays; nobody reads it
        assert slurm.command("scontrol", "release", job).returncode == 0
        wait_for(lambda: not slurm.command("squeue", "-h", "-j", job).stdout.strip(), timeout=120,
                 what="the job's end\n" + (out.read_text() if out.exists() else ""))
        left = sorted(p.name for p in folder.iterdir())  # the folder is not the daemon's: it stays
    finally:
        slurm.command("scancel", job)
        shutil.rmtree(folder, ignore_errors=True)
    log = out.read_text()
    assert log.count("trained") == 2 and log.count("sentinel daemon: export SENTINEL_SOCKET=") == 1, log
    assert "metrics at http://127.0.0.1:9400" not in log and "starts one of its own" not in log, log
    assert not left, (left, log)
    assert "ExitCode=3:0" in slurm.command("scontrol", "show", "job", job).stdout, log
    run = wait_for(lambda: find_run(sqlite3.connect(db), job), timeout=30, what="the job's run in the history")
    assert run.ranks == 2 and run.exit_status == 3 and run.state == "crashed", (run, log)


# 10 steps, then it waits (for the kill: the time limit's comes up to a minute or more late)
_TRAIN_THEN_WAIT = """
import time, torch
from torch import nn
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
print("trained", flush=True)
time.sleep(900)
"""


def _crash_notice(receiver: Receiver) -> str:
    bodies = [str(b.get("title", "")) + "\n" + str(b.get("message", "")) for b in receiver.bodies]
    return next((b for b in bodies if "TrainingCrashed" in b or "crashed" in b.lower()), "")


def _killed_job(slurm: SlurmCluster, tmp_path: Path, receiver: Receiver, *sbatch_args: str,
                kill: bool) -> tuple[str, str]:
    config = write_config(tmp_path, notify={"urls": [receiver.url]}, history={"path": str(tmp_path / "h.sqlite")})
    job, out = _sbatch(slurm, tmp_path, config, *sbatch_args, wait=False,
                       script=[sys.executable, "-c", _TRAIN_THEN_WAIT])
    try:
        wait_for(lambda: out.exists() and out.read_text().count("trained") == 2, timeout=120,
                 what="both ranks trained")
        if kill:
            assert slurm.command("scancel", job).returncode == 0
        body = wait_for(lambda: _crash_notice(receiver), timeout=240,
                        what="TrainingCrashed\n" + (out.read_text() if out.exists() else ""))
        return job, body
    finally:
        slurm.command("scancel", job)


def test_scancel_is_reported_by_training_crashed_with_the_reason(
        slurm: SlurmCluster, tmp_path: Path, receiver: Receiver) -> None:
    job, body = _killed_job(slurm, tmp_path, receiver, kill=True)
    assert f"the Slurm job {job} was cancelled (scancel)" in body, body
    assert "SIGTERM" in body and f"slurm_job={job}" in body and f"slurm_node={slurm.node}" in body


@pytest.mark.slow
def test_the_time_limit_is_reported_by_training_crashed_with_the_reason(
        slurm: SlurmCluster, tmp_path: Path, receiver: Receiver) -> None:
    job, body = _killed_job(slurm, tmp_path, receiver, "--time=0:05", kill=False)
    assert f"the Slurm job {job} reached its time limit" in body, body


@pytest.mark.slow
def test_scancel_of_an_srun_with_no_daemon_is_reported_by_the_daemon_its_tasks_started(
        slurm: SlurmCluster, tmp_path: Path, receiver: Receiver) -> None:
    config = write_config(tmp_path, notify={"urls": [receiver.url]}, history={"path": str(tmp_path / "h.sqlite")})
    env = {k: v for k, v in slurm.env.items() if k not in ("SENTINEL_SOCKET", "SENTINEL_URL")}
    proc = subprocess.Popen(["srun", "-n", "2", *SENTINEL.split(), "run", "--config", config, "--listen",
                             "127.0.0.1:0", "--", sys.executable, "-c", _TRAIN_THEN_WAIT],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[str] = []
    for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
        threading.Thread(target=lambda s=stream, k=sink: k.extend(s), daemon=True).start()  # type: ignore[misc]
    job = ""
    try:
        wait_for(lambda: "".join(out).count("trained") == 2, timeout=180, what="both ranks trained\n" + "".join(err))
        job = slurm.command("squeue", "-h", "-o", "%i").stdout.split()[0]
        assert slurm.command("scancel", job).returncode == 0
        body = wait_for(lambda: _crash_notice(receiver), timeout=120, what="TrainingCrashed\n" + "".join(err))
        proc.wait(timeout=60)
    finally:
        if job:
            slurm.command("scancel", job)
        end_process(proc)  # type: ignore[arg-type]
    assert f"the Slurm job {job} was cancelled (scancel)" in body, body
    assert "".join(err).count("metrics at") == 1, "".join(err)


def test_a_signal_to_the_step_reaches_the_script_once_and_the_job_goes_on(slurm: SlurmCluster, tmp_path: Path) -> None:
    """`#SBATCH --signal=USR1@90` or `scancel --signal=USR1`: Slurm signals every process of the
    step, the script under `sentinel run` included. `sentinel run` outlives it (unhandled, USR1
    would end it and with it the step) and adds no second one: Lightning's auto-requeue saves
    a checkpoint per signal."""
    env = {k: v for k, v in slurm.env.items() if k not in ("SENTINEL_SOCKET", "SENTINEL_URL")}
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(["srun", "-n", "1", *SENTINEL.split(), "run", "--listen", "127.0.0.1:0", "--",
                                 sys.executable, str(SCRIPTS / "signal_train.py"), str(tmp_path)],
                                env=env, stdout=o, stderr=e)
    job = ""
    try:
        wait_for(lambda: "ready" in out.read_text(), timeout=180, what="training\n" + err.read_text())
        job = slurm.command("squeue", "-h", "-o", "%i").stdout.split()[0]
        assert slurm.command("scancel", "--signal=USR1", job).returncode == 0
        wait_for(lambda: (tmp_path / "signals").exists(), timeout=60, what="the script's SIGUSR1 handler")
        assert slurm.command("scancel", "--signal=TERM", job).returncode == 0
        status = proc.wait(60)
    finally:
        if job:
            slurm.command("scancel", job)
        end_process(proc)  # type: ignore[arg-type]
    assert status == 0, err.read_text()
    assert (tmp_path / "signals").read_text().split() == ["SIGUSR1", "SIGTERM"], err.read_text()
    assert out.read_text().splitlines()[-1] == "done"
