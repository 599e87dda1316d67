"""Every key the instrument writes is read back out of the engine, the history and
``/api/v1/status`` (issue 18, point 7): a key renamed on one side fails here.

A real monitor with every probe on (clipping, AMP, a scheduler, tags, scalars, the update
and health samplers at every step) reports to the embedded engine (a thread) that records
history in a real SQLite file; each key of its frames has a witness below.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import sentinel
from tests.helpers import wait_for

pytestmark = pytest.mark.integration
STEPS = 6

# key -> the engine's series it becomes (each must hold a value)
ENGINE: dict[str, tuple[str, ...]] = {
    "step": ("sentinel_step", "sentinel_steps_total"),
    "t": ("sentinel_last_step_timestamp_seconds",),
    "groups": ("sentinel_group_grad_norm",),
    "grad_sumsq": ("sentinel_grad_norm", "sentinel_group_grad_norm"),
    "param_sumsq": ("sentinel_param_norm", "sentinel_group_param_norm"),
    "delta_sumsq": ("sentinel_update_ratio", "sentinel_update_norm", "sentinel_group_update_ratio"),
    "delta_l1": ("sentinel_update_mean_abs_ratio", "sentinel_group_update_mean_abs_ratio"),
    "param_l1": ("sentinel_update_mean_abs_ratio",),
    "clip_norm": ("sentinel_grad_norm_preclip", "sentinel_grad_clipped_steps_total"),
    "clip_max": ("sentinel_grad_clip_max_norm",),
    "grad_l1": ("sentinel_gradient_snr",),
    "grad_count": ("sentinel_gradient_snr",),
    "sat": ("sentinel_optimizer_state_saturation_ratio",),
    "lr": ("sentinel_learning_rate",),
    "lr_peak": ("sentinel_learning_rate_schedule_ratio",),
    "step_seconds": ("sentinel_step_duration_seconds",),
    "busy_seconds": ("sentinel_step_busy_seconds",),
    "state_bytes": ("sentinel_optimizer_state_bytes", "sentinel_optimizer_state_param_ratio"),
    "param_bytes": ("sentinel_param_bytes",),
    "mem": ("sentinel_host_memory_rss_bytes", "sentinel_memory_used_bytes"),
    "optim": ("sentinel_optimizer_info", "sentinel_optimizer_beta2_memory_ratio"),
    "total_steps": ("sentinel_optimizer_hyperparameter",),
    "env": ("sentinel_environment_info",),
    "amp": ("sentinel_amp_loss_scale",),
    "scalars": ("sentinel_loss", "sentinel_scalar"),
    "errors": ("sentinel_instrument_errors_total",),
    "dropped": ("sentinel_frames_dropped_total",),
    "tags": ("sentinel_run_info",),
}
# key -> the history's column of the run (runs table) or of its samples
HISTORY: dict[str, str] = {"optim": "runs.optimizer", "tags": "runs.tags", "cmd": "runs.command", "env": "runs.env",
                           "scalars": "samples.loss", "grad_sumsq": "samples.grad_norm", "lr": "samples.lr",
                           "clip_norm": "samples.clip_norm", "param_sumsq": "samples.param_norm",
                           "delta_sumsq": "samples.update_ratio", "world": "runs.world", "step": "runs.steps"}
# keys that identify a frame or route it rather than carry a value
IDENTITY = {"v", "kind", "job", "run", "rank", "world", "shard", "cmd", "reply"}
# key -> the /api/v1/status chart it feeds
STATUS = {"scalars": "loss", "grad_sumsq": "grad_norm", "delta_sumsq": "update_ratio", "lr": "learning_rate",
          "mem": "memory_used"}


def test_every_key_the_instrument_writes_is_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=STEPS + 1)
    scaler = torch.amp.GradScaler("cpu")
    frames: list[dict[str, Any]] = []
    mon = sentinel.watch(model, opt, scaler=scaler, run="keys", engine="thread", listen="127.0.0.1:0",
                         update_every=1, health_every=1, state_every=1, memory_every=1, tags={"seed": "1"},
                         total_steps=STEPS)
    engine = mon.engine.service.engine
    engine.frame_listeners.append(frames.append)
    for _ in range(STEPS):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()
        sched.step()
        mon.log(loss=loss, acc=0.5)
    wait_for(lambda: sum(f["kind"] == "step" for f in frames) == STEPS, what="every step frame ingested")
    status = json.load(urllib.request.urlopen(f"{mon.url}/api/v1/status?run=train/keys", timeout=10))
    store = engine.store
    sent = {k for f in frames if f["kind"] == "step" for k in f}

    unknown = sent - set(ENGINE) - set(HISTORY) - IDENTITY
    assert not unknown, f"keys the instrument sends that nothing here reads back: {sorted(unknown)}"
    never_sent = (set(ENGINE) | set(HISTORY) | set(STATUS)) - sent - {"busy_seconds"}
    assert not never_sent, f"keys read back that the instrument no longer sends: {sorted(never_sent)}"
    missing = [f"{key} -> {metric}" for key, metrics in ENGINE.items() if key in sent for metric in metrics
               if not store.labelsets(metric)]  # a counter at 0 counts: it is exported
    assert not missing, f"keys the engine did not turn into series: {missing}"
    for chart, series in status["charts"].items():
        assert series["ranks"], chart
    assert {STATUS[k] for k in STATUS} <= set(status["charts"])
    mon.close()

    db = sqlite3.connect(tmp_path / "sentinel" / "history.sqlite")
    db.row_factory = sqlite3.Row
    run = db.execute("SELECT * FROM runs WHERE run = 'keys'").fetchone()
    samples = db.execute("SELECT * FROM samples WHERE run_id = ? ORDER BY step", (run["id"],)).fetchall()
    empty = []
    for key, where in HISTORY.items():
        table, column = where.split(".")
        values = [run[column]] if table == "runs" else [s[column] for s in samples]
        if not any(v not in (None, "", 0) for v in values):
            empty.append(f"{key} -> {where}")
    assert not empty, f"keys the history did not record: {empty}"
    assert json.loads(run["optimizer"])[0]["class"] == "AdamW" and run["steps"] == STEPS
