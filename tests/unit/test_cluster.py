"""Slurm naming and labels, Slurm durations, the fleet profile's filter, the job-wide rule
file, and when ``sentinel run`` attaches to a node's daemon."""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path

import pytest

from sentinel import attach
from sentinel.attach import attached_socket, task_rank
from sentinel.instrument.options import slurm_job_name, slurm_tags
from sentinel.serve.profile import fleet_rows, profile_filter
from sentinel.slurm import end_reason, seconds
from sentinel.store import labels_of

JOB = {"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "gpu17", "SLURM_PROCID": "3",
       "SLURM_NTASKS": "8"}
ARRAY = {**JOB, "SLURM_JOB_ID": "815", "SLURM_ARRAY_JOB_ID": "812", "SLURM_ARRAY_TASK_ID": "3"}


@pytest.mark.parametrize(("env", "name", "tags"), [
    ({}, "", {}),
    (JOB, "812", {"slurm_job": "812", "slurm_step": "0", "slurm_node": "gpu17"}),
    (ARRAY, "812_3", {"slurm_job": "812_3", "slurm_step": "0", "slurm_node": "gpu17"}),
    ({"SLURM_JOB_ID": "9"}, "9", {"slurm_job": "9"}),
])
def test_slurm_names_the_run_and_labels_it(env: dict[str, str], name: str, tags: dict[str, str]) -> None:
    assert slurm_job_name(env) == name and slurm_tags(env) == tags


@pytest.mark.parametrize(("env", "rank"), [(JOB, (3, 8)), ({"RANK": "5", "WORLD_SIZE": "16", **JOB}, (5, 16)), ({}, (0, 1))])
def test_a_task_rank_comes_from_the_launcher(env: dict[str, str], rank: tuple[int, int]) -> None:
    assert task_rank(env) == rank


@pytest.mark.parametrize(("text", "secs"), [("00:00:05", 5), ("1-02:00:00", 93600), ("10:30", 630), ("5", 300),
                                            ("UNLIMITED", None), ("", None), ("1:2:3:4", None)])
def test_slurm_durations(text: str, secs: float | None) -> None:
    assert seconds(text) == secs


@pytest.mark.parametrize(("status", "env"), [(143, {}), (1, JOB), (0, JOB)])
def test_no_slurm_reason_outside_slurm_or_for_a_plain_exit(status: int, env: dict[str, str]) -> None:
    assert end_reason(status, env) == ""


@pytest.mark.parametrize(("state", "run_time", "reason"), [
    ("COMPLETING", "00:01:01", "reached its time limit"),
    ("COMPLETING", "00:00:59", "reached its time limit"),  # Reason=TimeLimit tells it, whatever RunTime rounds to
    ("CANCELLED", "00:00:30", "was cancelled (scancel)"),
])
def test_the_end_reason_survives_an_scontrol_killed_by_the_second_sigterm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, run_time: str, reason: str) -> None:
    """Slurm sends a time limit's SIGTERM twice, milliseconds apart, to every process of the
    step: the second can kill the ``scontrol`` that ``sentinel run`` started for the first,
    which CI saw as a TrainingCrashed without its reason. A stand-in ``scontrol`` on PATH (the
    race cannot be timed against the real one; tests/integration/test_slurm.py runs the real
    cluster) dies by SIGTERM at its first call and answers at its second."""
    marker = tmp_path / "called"
    why = "Reason=TimeLimit" if state == "COMPLETING" else "Reason=None"
    fake = tmp_path / "scontrol"
    fake.write_text(f"""#!/bin/sh
if [ ! -e {marker} ]; then touch {marker}; kill -TERM $$; fi
echo "JobId=812 JobName=train JobState={state} {why} RunTime={run_time} TimeLimit=00:01:00"
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    got = end_reason(143, JOB)
    assert marker.exists()
    assert got.startswith(f"the Slurm job 812 {reason}"), got


def _rows(ranks: int, groups: int) -> list[tuple[str, str, tuple[tuple[str, str], ...], float]]:
    out = []
    for r in range(ranks):
        out.append(("sentinel_grad_norm", "gauge", labels_of(job="j", run="x", rank=r), 1.0))
        for g in range(groups):
            for name in ("sentinel_group_grad_norm", "sentinel_local_group_grad_norm"):
                out.append((name, "gauge", labels_of(job="j", run="x", rank=r + 2, group=f"g{g}"), 1.0))
    return out


@pytest.mark.parametrize(("active", "per_group"), [
    ([], {("sentinel_group_grad_norm", "2")}),  # the lowest rank (2 here) only, no shard sums
    ([{"job": "j", "run": "x", "groups": ["g1"], "ranks": [3]}],
     {("sentinel_group_grad_norm", "2"), ("sentinel_group_grad_norm", "3")}),
    ([{"job": "j", "run": "other", "groups": ["g1"], "ranks": [3]}], {("sentinel_group_grad_norm", "2")}),
])
def test_the_fleet_profile_keeps_every_rank_and_the_lowest_ranks_groups(
        active: list[dict[str, object]], per_group: set[tuple[str, str]]) -> None:
    rows = list(fleet_rows(_rows(4, 3), active))
    assert len([r for r in rows if r[0] == "sentinel_grad_norm"]) == 4
    kept = {(name, dict(labels)["rank"]) for name, _, labels, _ in rows if "group" in dict(labels)}
    assert kept == per_group
    counts = {rank: len([r for r in rows if dict(r[2]).get("rank") == rank and "group" in dict(r[2])])
              for _, rank in per_group}
    assert counts["2"] == 3 and all(n == 1 for rank, n in counts.items() if rank != "2")


def test_profiles_by_name() -> None:
    assert profile_filter("full", list) is None and profile_filter("fleet", list) is not None
    with pytest.raises(ValueError, match="profile"):
        profile_filter("tiny", list)


def test_the_job_rule_file_passes_promtool_check_and_its_tests() -> None:
    import shutil

    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (make system-deps)")
    path = Path(__file__).resolve().parents[2] / "alerts" / "sentinel.job.rules.yml"
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "SUCCESS: 11 rules found" in out.stdout, out.stdout + out.stderr
    test = subprocess.run(["promtool", "test", "rules", "sentinel.job.rules.test.yml"], cwd=path.parent / "tests",
                          capture_output=True, text=True, timeout=60)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


def test_sentinel_run_attaches_only_to_a_socket_someone_reads(tmp_path: Path) -> None:
    path = tmp_path / "engine.sock"
    assert attached_socket({}) is None and attached_socket({"SENTINEL_SOCKET": str(path)}) is None
    path.write_text("not a socket")
    assert attached_socket({"SENTINEL_SOCKET": str(path)}) is None
    path.unlink()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    try:
        assert attached_socket({"SENTINEL_SOCKET": str(path)}) == str(path)
    finally:
        s.close()
    assert attached_socket({"SENTINEL_SOCKET": str(path)}) is None  # left behind by a daemon that is gone


def test_sentinel_socket_wait_waits_through_a_stale_socket_for_the_daemon(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "engine.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(path))
    stale.close()  # what a SIGKILLed daemon leaves
    env = {"SENTINEL_SOCKET": str(path), "SENTINEL_SOCKET_WAIT": "30"}
    probes: list[bool] = []
    refused = threading.Event()
    listening = attach.listening

    def probe(p: str) -> bool:
        probes.append(listening(p))
        if not probes[-1]:
            refused.set()
        return probes[-1]

    monkeypatch.setattr("sentinel.attach.listening", probe)
    assert attached_socket({"SENTINEL_SOCKET": str(path)}) is None and probes == [False]  # no wait asked: once
    daemon = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    refused.clear()

    def late_daemon() -> None:
        assert refused.wait(30)  # the waiting task found the stale socket first
        path.unlink()  # as the daemon's listener clears a stale socket, then binds
        daemon.bind(str(path))

    binder = threading.Thread(target=late_daemon)
    binder.start()
    try:
        assert attached_socket(env) == str(path)
    finally:
        binder.join()
        daemon.close()
    assert probes[1] is False and probes[-1] is True  # refused, waited, then the daemon's socket
    assert capsys.readouterr().err == ""
    probes.clear()
    assert attached_socket({**env, "SENTINEL_SOCKET_WAIT": "0.3"}) is None  # nobody reads it now
    assert len(probes) > 1 and not any(probes)  # it kept probing until its wait ran out
    assert f"no daemon listens on SENTINEL_SOCKET={path} after 0.3 s" in capsys.readouterr().err
    probes.clear()
    assert attached_socket({**env, "SENTINEL_SOCKET_WAIT": "soon"}) is None and probes == [False]
    assert "SENTINEL_SOCKET_WAIT='soon' is not a number of seconds" in capsys.readouterr().err


def test_the_slurm_tags_join_the_users_within_the_cap() -> None:
    import json

    from sentinel.instrument.options import MAX_TAGS
    from sentinel.run import child_env

    env = child_env("/s", "http://x", base=dict(JOB), tags={"lr": "3e-4"})
    assert json.loads(env["SENTINEL_TAGS"]) == {"lr": "3e-4", "slurm_job": "812", "slurm_step": "0",
                                                "slurm_node": "gpu17"}
    assert env["SENTINEL_RUN"] != ""
    full = {f"t{i}": "v" for i in range(MAX_TAGS - 1)}
    tags = json.loads(child_env("/s", "http://x", base=dict(JOB), tags=full)["SENTINEL_TAGS"])
    assert len(tags) == MAX_TAGS and tags.items() >= full.items()  # the user's kept, one Slurm tag fits
    assert "SENTINEL_TAGS" not in child_env("/s", "http://x", base={})


_PY = "/usr/bin/python3"


@pytest.mark.parametrize(("cmd", "env", "name", "warned"), [
    # torchrun's --rdzv-id is given to every node: the run's name on all of them
    (["torchrun", "--nnodes", "2", "--rdzv-id", "exp7", "train.py", "--rdzv-id", "script's"], {}, "exp7", False),
    (["/opt/venv/bin/torchrun", "--nnodes=2", "--rdzv_id=exp7", "--nproc-per-node=8", "train.py"], {}, "exp7", False),
    ([_PY, "-m", "torch.distributed.run", "--nnodes", "2", "--rdzv-id", "x9", "t.py"], {}, "x9", False),
    (["torchrun", "--nnodes", "2", "--rdzv-id", "exp7", "t.py"], {"SENTINEL_RUN": "mine"}, "mine", False),
    (["torchrun", "--nnodes", "2", "t.py"], {"SLURM_JOB_ID": "812"}, "812", False),
    # no shared id: each node names its own, and says so once when the job spans nodes
    (["torchrun", "--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "t.py"], {}, None, True),
    (["torchrun", "--nnodes", "1:4", "--rdzv-id", "none", "t.py"], {}, None, True),
    (["torchrun", "--standalone", "--nproc-per-node", "8", "t.py"], {}, None, False),
    ([_PY, "train.py", "--rdzv-id", "x", "--nnodes", "2"], {}, None, False),  # not torchrun: the script's own
])
def test_the_run_name_of_a_command(cmd: list[str], env: dict[str, str], name: str | None, warned: bool) -> None:
    from sentinel.run import child_env, run_name

    got, note = run_name(cmd, env)
    assert got == name if name is not None else got.startswith(f"{socket.gethostname()}-")
    assert bool(note) == warned and (not note or "--rdzv-id" in note and "SENTINEL_RUN" in note)
    assert child_env("/s", "http://x", base=env, cmd=cmd)["SENTINEL_RUN"] == got or name is None
