"""Trials in threads of one process (Optuna's ``n_jobs``): each thread trains a model and an
optimizer of its own, at once (scripts/thread_trials.py).

Sentinel read one thread's gradients from the other thread's ``backward()`` (its monitors
listened to every ``backward()`` of the process) while the first thread's autograd was
writing them: the heap was corrupted and the script died on SIGABRT (``free(): corrupted
unsorted chunks``) in every run, in zero-code mode and with ``sentinel.watch``. Both
threads' ``watch()`` also started an engine each, which opened the new history file at once:
one of them recorded nothing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import write_config

pytestmark = pytest.mark.integration
SCRIPT = str(Path(__file__).parent / "scripts" / "thread_trials.py")


def _plain(tmp_path: Path) -> tuple[str, dict[str, list[float]]]:
    out = tmp_path / "plain.json"
    done = subprocess.run([sys.executable, SCRIPT, str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(out.read_text())


def _streams(history: Path) -> list[list[tuple[float | None, float | None]]]:
    """Each stream's (loss, clip norm) by step (the history keeps the first stream in ``samples``)."""
    with sqlite3.connect(history) as db:
        assert db.execute("SELECT count(*) FROM runs").fetchone() == (1,)
        first = db.execute("SELECT loss, clip_norm FROM samples ORDER BY step").fetchall()
        others = [db.execute("SELECT loss, clip_norm FROM stream_samples WHERE stream = ? ORDER BY step",
                             (s,)).fetchall()
                  for (s,) in db.execute("SELECT DISTINCT stream FROM stream_samples ORDER BY stream")]
        assert db.execute("SELECT alertname FROM alerts WHERE severity != 'info'").fetchall() == []
    return [first, *others]


def _matched(streams: list[list[tuple[float | None, float | None]]], losses: dict[str, list[float]],
             from_step: int) -> dict[str, int]:
    """Which trial each stream is (the one whose every loss from ``from_step`` on it
    equals), with the steps that carried a clip norm."""
    names = {}
    for seq in streams:
        assert len(seq) == 300, len(seq)
        for name, ref in losses.items():
            if all(v is not None and v == pytest.approx(r, rel=1e-6)
                   for (v, _), r in zip(seq[from_step - 1:], ref[from_step - 1:])):
                names[name] = sum(clip is not None for _, clip in seq)
    return names


def test_trials_in_threads_under_sentinel_run_are_streams_of_their_own(tmp_path: Path) -> None:
    stdout, losses = _plain(tmp_path)
    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05})
    out = tmp_path / "watched.json"
    done = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen", "127.0.0.1:0",
                           "--", sys.executable, SCRIPT, str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SENTINEL_RUN": "trials"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == stdout and json.loads(out.read_text()) == losses  # bit for bit
    # a thread's first step whose losses the other thread's early ones stood for is not known
    assert _matched(_streams(history), losses, from_step=2) == {"adam": 0, "sgd": 300}  # its own clipping


def test_trials_in_threads_each_with_its_own_watch_share_one_engine(tmp_path: Path) -> None:
    _, losses = _plain(tmp_path)
    out = tmp_path / "watched.json"
    done = subprocess.run([sys.executable, SCRIPT, str(out), "watch"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == losses
    # one engine, so one run of two streams (with an engine each, two runs of one stream each)
    assert _matched(_streams(tmp_path / "state" / "sentinel" / "history.sqlite"), losses, from_step=1) == {
        "adam": 0, "sgd": 300}
