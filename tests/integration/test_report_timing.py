"""A step's report goes out as soon as nothing more can arrive for it, and a monitor that is
never closed flushes at interpreter exit (issue 18, point 6)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import sentinel
from sentinel.store import labels_of
from tests.helpers import make_monitor, wait_for

pytestmark = pytest.mark.integration
STEPS = 20


def test_watch_in_configure_optimizers_reports_every_step_before_close() -> None:
    lightning = pytest.importorskip("lightning")

    class Module(lightning.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
            self.mon: sentinel.Monitor | None = None

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            opt = torch.optim.SGD(self.parameters(), lr=0.01)
            self.mon = sentinel.watch(self, opt, run="in-configure", engine="thread", listen="127.0.0.1:0")
            return opt

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    module = Module()
    trainer = lightning.Trainer(max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(module, data)
    mon = module.mon
    assert mon is not None
    engine = mon.engine.service.engine
    base = labels_of(job=mon.options.job, run="in-configure", rank=0)
    try:  # before close(): every optimizer step is in, the last one too
        wait_for(lambda: engine.store.counter("sentinel_steps_total", base) == STEPS, timeout=15,
                 what=f"{STEPS} steps counted before close()")
    finally:
        mon.close()


def test_a_report_waiting_for_log_goes_at_the_next_backward() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt)
    for i in range(3):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        if i == 0:
            mon.log(loss=loss)  # logs, so a report may wait for a log() after its step
        loss.backward()
        before = len(sender.steps())
        opt.step()
        assert len(sender.steps()) >= before  # (a log before the step sends it at once)
    assert [f["step"] for f in sender.steps()][-1] >= 2
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()  # nothing more can come for step 3
    assert [f["step"] for f in sender.steps()] == [1, 2, 3]
    mon.close()


_NEVER_CLOSED = r"""
import sys, torch, sentinel
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
mon = sentinel.watch(model, opt, run="never-closed", engine="thread")
for _ in range(int(sys.argv[1])):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    mon.log(loss=loss)
print("trained")  # and exits without mon.close()
"""


def test_a_monitor_never_closed_flushes_at_exit(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _NEVER_CLOSED, str(STEPS)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0 and out.stdout == "trained\n", out.stderr
    db = sqlite3.connect(tmp_path / "sentinel" / "history.sqlite")
    rows = db.execute("SELECT steps, state, optimizer FROM runs WHERE run = 'never-closed'").fetchall()
    assert [(steps, state, json.loads(optim)[0]["class"]) for steps, state, optim in rows] == \
        [(STEPS, "finished", "AdamW")]
