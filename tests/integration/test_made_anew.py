"""Scripts that make their model or optimizer anew, or drop them, under ``sentinel run``
(zero-code). k-fold cross-validation,
the shape of the public Kaggle notebooks (tests/integration/scripts/kfold_train.py): a new
model, AdamW and LambdaLR per fold, each fold's model and optimizer dropped before the next;
training inside ``main()``, whose model is garbage once it returns; and an optimizer made
anew each epoch to set its learning rate.

Sentinel must leave the script as it was: the same output (so each fold's model and
optimizer are freed as without it: a monitor holding them would take a model and its
optimizer state per fold, the next fold's OOM on a GPU), the same saved files, and no
alert from reading a fold's first, high losses against the last fold's low ones.

Real parts: CPU training, ``sentinel run``'s daemon, the history in SQLite.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from tests.helpers import wait_for, write_config
from tests.integration.test_prometheus import _free_port

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).parent / "scripts"
SCRIPT = SCRIPTS / "kfold_train.py"


@pytest.mark.parametrize("drop", ["del and gc.collect()", "bound anew"])
def test_kfold_under_sentinel_run_frees_each_fold_and_raises_no_alert(tmp_path: Path, drop: str) -> None:
    flags = ["--no-gc"] if drop == "bound anew" else []
    plain = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "plain"), *flags], capture_output=True,
                           text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    if flags:  # each fold's set-up and first step: the fold before is gone
        assert plain.stdout.count("set up: the fold before's model and optimizer alive: (False, False)") == 2
        assert plain.stdout.count("first step: the fold before's model and optimizer alive: (False, False)") == 2
    else:
        assert "alive: [(False, False), (False, False), (False, False)]" in plain.stdout

    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05})
    watched = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen",
                              "127.0.0.1:0", "--", sys.executable, str(SCRIPT), str(tmp_path / "watched"), *flags],
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "SENTINEL_RUN": "kfold"})
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout == plain.stdout  # bit-identical training, and every fold freed
    assert [ln for ln in watched.stderr.splitlines() if ln.startswith("sentinel:")
            and "metrics at" not in ln] == [], watched.stderr
    for fold in range(3):
        want = torch.load(tmp_path / "plain" / f"fold{fold}.pt", weights_only=True)
        got = torch.load(tmp_path / "watched" / f"fold{fold}.pt", weights_only=True)
        assert list(got) == list(want) and all(torch.equal(want[k], got[k]) for k in want)
    with sqlite3.connect(history) as db:
        fired = db.execute("SELECT alertname, severity FROM alerts WHERE state_to = 'firing'").fetchall()
        state = db.execute("SELECT state FROM runs WHERE run = 'kfold'").fetchall()
    assert fired == [], fired
    assert state == [("finished",)] * 3  # a row per fold (attempt 1, 2, 3), each ended


def test_a_model_dropped_after_training_ends_its_stream_with_a_goodbye_not_a_crash(tmp_path: Path) -> None:
    """Attached to a node's daemon (the Slurm batch script, the systemd unit): the monitor
    goes with the model main() dropped, and its goodbye goes out then; without it the
    daemon found a process gone without one and paged a critical TrainingCrashed."""
    sock, port = tmp_path / "node" / "engine.sock", _free_port()
    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05})
    daemon = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "daemon", "--socket", str(sock), "--config",
                               cfg, "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, timeout=30, what="the node daemon")
        env = {**os.environ, "SENTINEL_SOCKET": str(sock), "SENTINEL_RUN": "in-main"}
        out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--", sys.executable,
                              str(SCRIPTS / "train_in_main.py"), "3"], capture_output=True, text=True, timeout=300,
                             env=env)
        assert out.returncode == 0 and out.stdout.endswith("done\n"), out.stderr

        def ended() -> str | None:  # a goodbye ends the run; a process gone without one, a crash
            if not history.exists():
                return None
            with sqlite3.connect(history) as db:
                row = db.execute("SELECT state FROM runs WHERE run = 'in-main'").fetchone()
            return row[0] if row is not None and row[0] != "running" else None

        assert wait_for(ended, timeout=30, what="the run's end") == "finished"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=5) as r:
            alerts = json.loads(r.read())["data"]["alerts"]
        assert [a["alertname"] for a in alerts if a["run"] == "in-main"] == [], alerts
        assert not list(sock.parent.glob("reply-*.sock"))  # the gone monitor's way back, removed
    finally:
        daemon.terminate()
        daemon.wait(20)


def test_an_optimizer_made_anew_each_epoch_is_followed_quietly(tmp_path: Path) -> None:
    """The same model, a new SGD each epoch: one stream whose steps go on, the same output,
    and nothing on stderr but Sentinel's address (not a line an epoch)."""
    plain, watched, history = _plain_and_watched(tmp_path, [str(SCRIPTS / "optimizer_per_epoch.py")], "per-epoch")
    assert [ln for ln in watched.stderr.splitlines() if "metrics at" not in ln] == [], watched.stderr
    with sqlite3.connect(history) as db:
        rows = db.execute("SELECT steps, state FROM runs WHERE run = 'per-epoch'").fetchall()
    assert rows == [(32, "finished")]  # 4 epochs of 8 steps, one run: the steps went on


def test_a_dropped_model_whose_body_trains_on_is_one_training(tmp_path: Path) -> None:
    """A model the script drops ends its training (its monitor closes at once, so that its
    weights, gradients and optimizer state go as they would without Sentinel: the kfold
    test above), but not while a part of it trains on: a re-initialised stem, then the
    body trained alone after ``del net``. One run of 60 steps, its losses the printed ones."""
    plain, watched, history = _plain_and_watched(tmp_path, [str(SCRIPTS / "body_trains_on.py")], "body")
    assert [ln for ln in watched.stderr.splitlines() if "metrics at" not in ln] == [], watched.stderr
    with sqlite3.connect(history) as db:
        rows = db.execute("SELECT steps, state FROM runs WHERE run = 'body'").fetchall()
        last = db.execute("SELECT loss FROM samples WHERE run_id = (SELECT id FROM runs WHERE run = 'body') "
                          "ORDER BY step DESC LIMIT 1").fetchone()
    assert rows == [(60, "finished")]
    assert last is not None and abs(last[0] - float(plain.stdout.split()[-1])) < 1e-6


@pytest.mark.slow  # 25-47 s: behind the marker, to keep `make test` well under its 20 minutes
def test_a_model_and_optimizer_made_per_task_are_left_alone_after_three_short_trainings(tmp_path: Path) -> None:
    """Reptile in the shape of the public ports (scripts/reptile_tasks.py): per task a copy of
    the meta-model and a fresh Adam for 5 steps, then the meta-SGD's step on the distance
    they travelled; at the end a fine-tune of 300 steps of 50 ms (15 s: the watch begins
    after about 4 s here). Each task's optimizer attached a new monitor, at about 0.2 s each
    (200 tasks: 40 s against 1.7 s), and the history got a row per task. Now, after three
    such short trainings in turn, one line says so and each new optimizer trains unwatched
    until an attach costs it little: the fine-tune is watched from there as a new training
    whose steps go on from Adam's count, its losses the printed ones. The meta-optimizer
    keeps its own stream (it collided with the tasks' before) and none of the tasks'
    losses: no alert fires but the configuration's note on Adam's beta1 of 0."""
    plain, watched, history = _plain_and_watched(
        tmp_path, [str(SCRIPTS / "reptile_tasks.py"), "40", "5", "300", "0.05"], "reptile")
    lines = [ln for ln in watched.stderr.splitlines() if "metrics at" not in ln]
    assert len(lines) == 1 and lines[0].startswith(
        "sentinel: 3 optimizers made one after the other each trained for less than 20 times what watching it "
        "cost"), watched.stderr
    with sqlite3.connect(history) as db:
        rows = db.execute("SELECT id, steps, state FROM runs WHERE run = 'reptile' ORDER BY attempt").fetchall()
        fired = db.execute("SELECT DISTINCT alertname, severity FROM alerts WHERE state_to = 'firing'").fetchall()
        tuned = dict(db.execute("SELECT step, loss FROM samples WHERE run_id = ?", (rows[-1][0],)).fetchall())
        meta = db.execute("SELECT step, loss FROM stream_samples WHERE stream = '1' ORDER BY step").fetchall()
    # tasks 1-4 attached (the meta-optimizer's first steps came between them), then only the fine-tune
    assert [r[1:] for r in rows[:4]] == [(5, "finished")] * 4 and len(rows) == 5, rows
    assert rows[4][1:] == (300, "finished"), rows
    assert fired == [("OptimizerBeta1Low", "info")]  # Adam(betas=(0, 0.999)), the ports' choice: true
    printed = plain.stdout.splitlines()[-1]
    every10 = [float(v.strip("'")) for v in printed.split("[")[1].split("]")[0].split(", ")]
    first = min(tuned)  # watched after a few seconds of training, every step from there
    assert 1 < first < 300 and sorted(tuned) == list(range(first, 301)), sorted(tuned)
    assert tuned[300] == float(printed.rsplit(" ", 1)[1])
    assert all(tuned[s] == every10[(s - 1) // 10] for s in tuned if (s - 1) % 10 == 0)
    assert [s for s, _ in meta] == list(range(1, 41))  # one stream for the meta-optimizer, every step
    assert [s for s, loss in meta if loss is not None and s > 4] == []  # the tasks' losses are not its own


@pytest.mark.parametrize(("shape", "members"), [("list", 5), ("locals", 4)])
def test_optimizers_made_up_front_and_stepped_in_turn_are_each_watched_throughout(
        tmp_path: Path, shape: str, members: int) -> None:
    """A deep ensemble's members, or a main()'s heads, each stepped once per batch in turn: the
    first batch attaches one monitor after another, which looked like a series of short
    trainings (Reptile's per task), and every stream after its first step went unwatched."""
    _, watched, history = _plain_and_watched(
        tmp_path, [str(SCRIPTS / "ensemble.py"), shape, "120", str(members)], f"ensemble-{shape}")
    assert "one after the other" not in watched.stderr, watched.stderr
    with sqlite3.connect(history) as con:
        first = con.execute("SELECT count(*), min(step), max(step) FROM samples").fetchone()
        others = con.execute("SELECT stream, count(*), min(step), max(step) FROM stream_samples GROUP BY stream").fetchall()
    assert first == (120, 1, 120)
    assert others == [(str(k), 120, 1, 120) for k in range(1, members)]


def test_two_optimizers_over_a_shared_trunk_are_two_streams_each_with_its_loss(tmp_path: Path) -> None:
    """A multi-task script's optimizers, each over the trunk and its head, stepped in turn
    (scripts/multitask_shared.py): the second, whose first parameter the first watched, was
    taken for one made anew in its place; each step of either handed the stream over, and one
    stream alternated between the MSE and the cross-entropy (a LossSpike and a LossOscillation
    warning on a healthy run). Told apart, each was then taken for a game's player (each one's
    loss changes the trunk's gradients, which the other steps), its loss no loss."""
    plain, watched, history = _plain_and_watched(tmp_path, [str(SCRIPTS / "multitask_shared.py"), "300"], "mt")
    with sqlite3.connect(history) as con:
        a = dict(con.execute("SELECT step, loss FROM samples").fetchall())
        b = dict(con.execute("SELECT step, loss FROM stream_samples WHERE stream = '1'").fetchall())
        fired = con.execute("SELECT alertname FROM alerts WHERE state_to = 'firing' AND severity != 'info'").fetchall()
    assert sorted(a) == sorted(b) == list(range(1, 301))
    for line in plain.stdout.splitlines():  # every loss the stream's own, as the script printed it
        step, loss_a, loss_b = line.split()
        assert a[int(step) + 1] == pytest.approx(float(loss_a), rel=1e-6)
        assert b[int(step) + 1] == pytest.approx(float(loss_b), rel=1e-6)
    assert fired == []


def _plain_and_watched(tmp_path: Path, args: list[str], run: str,
                       ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str], Path]:
    """The script run plainly, then under ``sentinel run`` as ``run`` with a history: both
    runs (each exited 0, the same stdout) and the history's path."""
    script = [sys.executable, *args]
    plain = subprocess.run(script, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05})
    watched = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen",
                              "127.0.0.1:0", "--", *script], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "SENTINEL_RUN": run})
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout == plain.stdout
    return plain, watched, history
