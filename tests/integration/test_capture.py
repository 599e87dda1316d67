"""The capture action (issue 13, items 6 and 7): `actions.capture_on` saves the evidence of an
alert and the batch of its step, and the alert's message names the files.

Real parts only: a small CPU training run, the engine service (thread mode, flushed after
each step so a step's frame is judged before the next forward; process mode through
`sentinel run`'s daemon), apprise json:// to a real local HTTP receiver.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

import sentinel
from sentinel.demo.tasks import DEFAULT_LR, Task, make_optimizer
from tests.helpers import MLP, Receiver, wait_for, write_config

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).parent / "scripts"


def _train_with_nan(model: MLP, mon: sentinel.Monitor, steps: int, nan_step: int, rows: int = 8) -> dict[int, torch.Tensor]:
    """A plain SGD loop; the gradients of step ``nan_step`` get a NaN. Returns what each
    step's forward was fed."""
    opt = mon.optimizers[0]
    gen = torch.Generator().manual_seed(0)
    fed: dict[int, torch.Tensor] = {}
    for step in range(1, steps + 1):
        x = torch.randn(rows, 16, generator=gen)
        fed[step] = x.clone()
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        if step == nan_step:
            model.layers[1][0].weight.grad[0, 0] = float("nan")
        opt.step()
        mon.log(loss=loss)
        assert mon.engine.flush()  # judged before the next step's forward: deterministic
    return fed


def _only_capture(root: Path, alertname: str, job: str = "*", run: str = "*") -> Path:
    """The one capture folder of an alert, ``<root>/<job>/<run>/<time>-step<N>-<alertname>``."""
    folders = [p for p in root.glob(f"{job}/{run}/*-step*-{alertname}") if p.is_dir()]
    assert len(folders) == 1, folders
    return folders[0]


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_capture_on_critical_saves_the_evidence_and_the_batch_and_the_message_names_them(
        tmp_path: Path, receiver: Receiver) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    root = tmp_path / "captures"
    cfg = write_config(tmp_path, notify={"urls": [receiver.url]},
                  actions={"capture_on": ["critical"], "capture_dir": str(root)})
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", job="ci", run="cap-run", config=cfg, engine="thread")
    try:
        fed = _train_with_nan(model, mon, 12, nan_step=9)
        with urllib.request.urlopen(mon.url + "/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert 'sentinel_captures_total{outcome="written"} 1.0' in metrics
    finally:
        mon.close()
    folder = _only_capture(root, "TrainingNonFinite", "ci", "cap-run")
    assert _mode(root) == _mode(folder) == 0o700
    evidence = json.loads((folder / "evidence.json").read_text())
    assert evidence["alert"]["alertname"] == "TrainingNonFinite" and evidence["alert"]["severity"] == "critical"
    assert evidence["alert"]["started_step"] == 9 and evidence["inputs"]["step"] == 9
    rank0 = evidence["ranks"]["0"]
    assert set(rank0["groups"]) == {"layers.0", "layers.1", "layers.2", "head"}
    assert rank0["groups"]["layers.1"]["grad_norm"] == {"step": 9, "value": "nan"}  # the first group that broke
    assert isinstance(rank0["groups"]["head"]["grad_norm"]["value"], float)
    loss = rank0["history"]["loss"]
    assert loss["steps"][-1] == 9 and len(loss["steps"]) >= 8 and all(isinstance(v, float) for v in loss["values"])
    assert rank0["history"]["grad_norm"]["values"][-1] == "nan"
    # the batch of step 9, exactly, as the training process fed it
    batch = folder / "inputs.rank0.pt"
    saved = torch.load(batch, weights_only=True)
    assert set(saved) == {"args.0"} and torch.equal(saved["args.0"], fed[9])
    described = json.loads((folder / "inputs.rank0.json").read_text())
    assert described["step"] == 9 and described["exact"] is True and "truncated" not in described
    assert _mode(folder / "evidence.json") == _mode(batch) == 0o600
    # the chat message names the evidence file and the batch
    body = wait_for(lambda: next((b for b in receiver.bodies if "TrainingNonFinite" in b.get("title", "")
                                  and "FIRING" in b.get("title", "")), None), what="the chat message")
    assert f"evidence: {folder / 'evidence.json'}" in body["message"]
    assert f"batch: {batch}" in body["message"]


def test_a_batch_over_capture_max_bytes_keeps_its_first_rows(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    root = tmp_path / "captures"
    cfg = write_config(tmp_path, actions={"capture_on": ["TrainingNonFinite"], "capture_dir": str(root),
                                     "capture_max_bytes": 1024})
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", job="ci", run="big", config=cfg, engine="thread")
    try:
        fed = _train_with_nan(model, mon, 10, nan_step=6, rows=64)  # 64 rows × 16 float32: 4 KiB
    finally:
        mon.close()
    folder = _only_capture(root, "TrainingNonFinite", "ci", "big")
    saved = torch.load(folder / "inputs.rank0.pt", weights_only=True)
    assert torch.equal(saved["args.0"], fed[6][:16])  # 1024 bytes hold 16 rows of 64 bytes
    described = json.loads((folder / "inputs.rank0.json").read_text())
    assert described["truncated"]["rows_kept"] == 16 and described["truncated"]["batch_rows"] == 64
    assert described["tensors"]["args.0"]["shape"] == [64, 16]
    assert described["tensors"]["args.0"]["saved_shape"] == [16, 16]


def test_gradient_noise_rising_captures_the_corrupt_batch(tmp_path: Path) -> None:
    """Seed 000 §4.4: when GVR rises suddenly, save the batch. The corrupt-batch-gvr
    scenario's run (inputs ×100 at step 250, after GVR's warm-up), here with a GradScaler
    so the evidence carries a loss-scale history."""
    task = Task("mlp", seed=0, batch=16)
    opt = make_optimizer("adamw", task.model.parameters(), DEFAULT_LR[("mlp", "adamw")])
    scaler = torch.amp.GradScaler("cpu")
    root = tmp_path / "captures"
    cfg = write_config(tmp_path, actions={"capture_on": ["GradientNoiseRising"], "capture_dir": str(root)})
    mon = sentinel.watch(task.model, opt, scaler=scaler, listen="127.0.0.1:0", job="ci", run="gvr", config=cfg,
                         engine="thread")
    corrupt: torch.Tensor | None = None
    try:
        for step in range(1, 271):
            x, y = task.batch()
            if step == 250:
                x, y = task.corrupt(x, y)
                corrupt = x.clone()
            loss = task.loss(task.model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            mon.log(loss=loss)
            assert mon.engine.flush()
    finally:
        mon.close()
    folder = _only_capture(root, "GradientNoiseRising", "ci", "gvr")
    evidence = json.loads((folder / "evidence.json").read_text())
    assert evidence["alert"]["alertname"] == "GradientNoiseRising" and evidence["alert"]["severity"] == "warning"
    assert evidence["inputs"]["step"] == 250
    history = evidence["ranks"]["0"]["history"]
    assert set(history["amp_loss_scale"]["values"]) == {65536.0}
    assert history["gradient_variance_ratio"]["steps"][-1] == 250
    saved = torch.load(folder / "inputs.rank0.pt", weights_only=True)
    assert corrupt is not None and torch.equal(saved["args.0"], corrupt)


def test_without_capture_on_nothing_is_hooked_and_nothing_written(
        tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"  # where the default capture folder would be
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = write_config(tmp_path, notify={"urls": [receiver.url]}, outbox={"path": str(tmp_path / "outbox.sqlite")},
                  history={"enabled": False})
    seen: list[dict[str, Any]] = []
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", job="ci", run="plain", config=cfg, engine="thread",
                         on_alert=seen.append)
    try:
        _train_with_nan(model, mon, 12, nan_step=9)
        assert mon.engine.service.capturer is None
        assert mon.capture.handle is None and not mon.capture.held  # no hook, no reference held
        assert not model._forward_pre_hooks_with_kwargs  # the capture hook is the only one with kwargs
    finally:
        mon.close()
    body = wait_for(lambda: next((b for b in receiver.bodies if "TrainingNonFinite" in b.get("title", "")), None),
                    what="the chat message")
    assert "evidence" not in body["message"] and "batch:" not in body["message"]
    assert any(a["alertname"] == "TrainingNonFinite" and "evidence" not in a for a in seen)
    assert not state.exists()  # no capture folder, under the default place or anywhere


def test_capture_through_the_daemon_of_sentinel_run(tmp_path: Path) -> None:
    """An unmodified script under `sentinel run`: the daemon arms the rank through its reply
    socket, the NaN inputs of the fault's first step are saved, and the stop action's
    message names the evidence."""
    root = tmp_path / "captures"
    cfg = write_config(tmp_path, actions={"stop_on": ["critical"], "capture_on": ["critical"],
                                     "capture_dir": str(root), "capture_steps": 64})
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen", "127.0.0.1:0",
                          "--", sys.executable, str(SCRIPTS / "faulty_train.py"), "400", "nan"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    folder = _only_capture(root, "TrainingNonFinite")
    evidence = json.loads((folder / "evidence.json").read_text())
    assert evidence["alert"]["alertname"] == "TrainingNonFinite" and evidence["inputs"]["step"] == 201
    assert f"Evidence: {folder / 'evidence.json'}" in out.stderr
    described = json.loads((folder / "inputs.rank0.json").read_text())
    assert described["step"] == 201 and described["exact"] is True, described
    saved = torch.load(folder / "inputs.rank0.pt", weights_only=True)
    assert saved["args.0"].shape == (16, 8) and bool(torch.isnan(saved["args.0"]).all())
