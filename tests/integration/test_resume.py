"""``sentinel run`` on a script resumed from its own checkpoint, as nanoGPT's
``init_from="resume"`` is: the resumed run's steps go on from the optimizer's count (the
checkpoint's 20 steps, then 21, 22, ...), as the Lightning and HF adapters go on from the
trainer's global step, so its alerts and its history name the steps the script's own log
names; and the training is the plain resumed run's, bit for bit."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).parent / "scripts" / "resume_train.py"


def _run(args: list[str], env: dict[str, str], sentinel: bool) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), *args]
    if sentinel:
        cmd = [sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr
    return out


def test_a_resumed_run_goes_on_from_the_checkpoints_step(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    _run([str(tmp_path / "out"), "20"], env, sentinel=True)
    shutil.copytree(tmp_path / "out", tmp_path / "plain")  # the same checkpoint, resumed without Sentinel
    resumed = _run([str(tmp_path / "out"), "15", "--resume"], env, sentinel=True)
    plain = _run([str(tmp_path / "plain"), "15", "--resume"], env, sentinel=False)
    assert resumed.stdout == plain.stdout  # the script's numbers are untouched
    logged = {int(ln.split()[1].rstrip(":")) + 1: float(ln.split()[-1]) for ln in plain.stdout.splitlines()}
    assert sorted(logged) == list(range(21, 36))  # the script's iter 20 is its 21st step

    db = sqlite3.connect(tmp_path / "state" / "sentinel" / "history.sqlite")
    runs = db.execute("SELECT id, steps, state, command FROM runs ORDER BY id").fetchall()
    assert [(steps, state) for _, steps, state, _ in runs] == [(20, "finished"), (35, "finished")]
    # each attempt records what ran
    assert runs[0][3].endswith("resume_train.py " + str(tmp_path / "out") + " 20")
    assert runs[1][3].endswith("resume_train.py " + str(tmp_path / "out") + " 15 --resume")
    samples = dict(db.execute("SELECT step, loss FROM samples WHERE run_id = ?", (runs[1][0],)).fetchall())
    assert sorted(samples) == sorted(logged)
    for step, loss in logged.items():
        assert samples[step] == pytest.approx(loss, rel=1e-6), step
    assert db.execute("SELECT alertname, step FROM alerts").fetchall() == []
