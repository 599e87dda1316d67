"""On CUDA, the hot path never synchronises the host with the device.

Runs only where a GPU is present (``@pytest.mark.gpu``); skipped cleanly otherwise.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

import sentinel
from sentinel.demo.model import TinyGPT, loss_fn, synthetic_batch
from tests.helpers import make_monitor, wait_for

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _train(mon: sentinel.Monitor | None, model: torch.nn.Module, opt: torch.optim.Optimizer,
           steps: int, sync_check: bool, reset: bool = True) -> None:
    gen = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(gen, 8, 64, 256, "cuda") for _ in range(steps)]
    torch.cuda.synchronize()
    if sync_check:
        torch.cuda.set_sync_debug_mode("error")
    try:
        for x, y in batches:
            loss = loss_fn(model(x), y)
            if reset:
                opt.zero_grad(set_to_none=False)  # set_to_none=True would be fine too; keeps grads resident
            loss.backward()
            opt.step()
            if mon is not None:
                mon.log(loss=loss)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_training_under_sync_debug_mode_error() -> None:
    torch.manual_seed(0)
    model = TinyGPT(dim=128, depth=4, seq=64).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    _train(None, model, opt, 2, sync_check=False)  # warm-up: lazy state allocation syncs inside torch
    mon, sender = make_monitor(model, opt, update_every=2, state_every=3, health_every=2, memory_every=2)
    _train(mon, model, opt, 12, sync_check=True)
    assert mon.errors == 0, mon.boundary.failures  # a sync inside a probe would raise and be counted
    mon.close()
    steps = sender.steps()
    assert len(steps) >= 11  # all but at most the in-flight ones were read without waiting
    assert [f["step"] for f in steps] == sorted(f["step"] for f in steps)


def test_a_loop_that_never_resets_its_gradients_is_told_without_a_sync() -> None:
    """No zero_grad(): the figure of the gradient each step's first backward() found is
    taken on the device and read back with the report (instrument/resets.py)."""
    torch.manual_seed(0)
    model = TinyGPT(dim=128, depth=2, seq=64).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    _train(None, model, opt, 2, sync_check=False)
    mon, sender = make_monitor(model, opt)
    _train(mon, model, opt, 8, sync_check=True, reset=False)
    assert mon.errors == 0, mon.boundary.failures
    mon.close()
    runs = [f.get("not_reset") for f in sender.steps()]
    assert runs[-3:] == [runs[-3], runs[-3] + 1, runs[-3] + 2] and runs[-3] >= 1, runs


def test_cuda_memory_metrics_exported() -> None:
    torch.manual_seed(0)
    model = TinyGPT(dim=64, depth=2, seq=64).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt, memory_every=1)
    _train(mon, model, opt, 3, sync_check=False)
    mon.close()
    labels = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    store = sender.engine.store
    total = store.last("sentinel_cuda_memory_total_bytes", labels)
    alloc = store.last("sentinel_cuda_memory_allocated_bytes", labels)
    peak = store.last("sentinel_cuda_memory_peak_bytes", labels)
    reserved = store.last("sentinel_cuda_memory_reserved_bytes", labels)
    assert total and alloc and peak and reserved
    assert 0 < alloc[2] <= peak[2] <= total[2] and alloc[2] <= reserved[2]
    assert store.counter("sentinel_cuda_ooms_total", labels) == 0
    assert "sentinel_cuda_alloc_retries_total" in store.names()


def test_holding_the_batch_for_a_capture_never_syncs(tmp_path: Path) -> None:
    """The capture action's forward pre-hook keeps references to CUDA inputs without a
    sync; the copy to the host happens later, in the writer thread, outside the check."""
    torch.manual_seed(0)
    model = TinyGPT(dim=64, depth=2, seq=64).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    _train(None, model, opt, 2, sync_check=False)
    mon, _ = make_monitor(model, opt)
    mon.capture.arm({"kind": "arm", "rank": 0, "steps": 3})
    _train(mon, model, opt, 6, sync_check=True)
    assert mon.errors == 0, mon.boundary.failures
    assert list(mon.capture.held) == [4, 5, 6]
    mon.capture.take({"kind": "capture", "ranks": [0], "step": 6, "folder": str(tmp_path), "max_bytes": 2**20})
    mon.close()  # waits for the writer
    gen = torch.Generator().manual_seed(0)
    sixth = [synthetic_batch(gen, 8, 64, 256, "cuda") for _ in range(6)][5][0]
    saved = torch.load(tmp_path / "inputs.rank0.pt", weights_only=True)
    assert torch.equal(saved["args.0"], sixth.cpu())
    described = json.loads((tmp_path / "inputs.rank0.json").read_text())
    assert described["tensors"]["args.0"]["device"] == "cuda:0" and described["exact"] is True


def test_an_evaluations_heartbeats_neither_sync_nor_break_a_cuda_graph_capture() -> None:
    """A beat (a report's events polled, a frame sent) from evaluation forwards under the
    sync debug mode; then a forward captured into a CUDA graph while a beat is due: the
    beat stays out of the capture, and the graph replays what the model computes."""
    torch.manual_seed(0)
    model = TinyGPT(dim=64, depth=2, seq=64).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    _train(None, model, opt, 2, sync_check=False)
    mon, sender = make_monitor(model, opt, heartbeat_seconds=0.05)
    _train(mon, model, opt, 3, sync_check=False)
    x, _ = synthetic_batch(torch.Generator().manual_seed(1), 8, 64, 256, "cuda")
    model.eval()
    time.sleep(0.1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.no_grad():
            for _ in range(3):
                model(x)
                time.sleep(0.06)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [f for f in sender.frames if "beat" in f]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):  # warm-up on a side stream, as torch's CUDA graph docs do
        for _ in range(2):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    time.sleep(0.1)  # a beat is due during the capture
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = model(x)
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        assert torch.allclose(out, model(x))
    assert mon.errors == 0, mon.boundary.failures
    mon.close()


def test_watch_with_its_defaults_under_bf16_autocast_never_syncs() -> None:
    """What a user runs: ``sentinel.watch`` with every default (the engine in its child process,
    the default rule pack), a bf16 autocast forward and fused AdamW, for 120 steps, so the
    early every-step samples, the every-10 memory reads and the every-100 update, state and
    health samplers all run inside the check. Every step reaches ``/metrics``."""
    torch.manual_seed(0)
    model = TinyGPT(vocab=1024, dim=256, depth=4, heads=4, seq=128).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    gen = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(gen, 8, 128, 1024, "cuda") for _ in range(8)]
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", run="gpu-defaults", job="gpu")

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mon.log(loss=loss)

    try:
        for i in range(2):  # lazy optimizer state and the first step's set-up, outside the check
            step(*batches[i])
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for i in range(118):
                step(*batches[i % len(batches)])
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert mon.errors == 0, mon.boundary.failures
        assert mon.url is not None

        def scrape() -> str:
            with urllib.request.urlopen(mon.url + "/metrics", timeout=5) as r:
                return r.read().decode()

        wait_for(lambda: 'sentinel_step{job="gpu",rank="0",run="gpu-defaults"} 120.0' in scrape(),
                 what="step 120 on /metrics")
        text = scrape()
        assert 'sentinel_cuda_memory_allocated_bytes{job="gpu"' in text
        assert "sentinel_update_ratio" in text and "sentinel_optimizer_state_bytes" in text
        assert mon.frames_dropped == 0
    finally:
        mon.close()


def test_fp16_autocast_with_a_grad_scaler_adds_no_sync_of_sentinels() -> None:
    """The most common GPU recipe: fp16 autocast and a ``GradScaler``, which itself syncs
    (its ``step`` reads ``found_inf``), so the debug mode cannot raise here. It warns
    instead, and each warning's Python stack says whose sync it is: none may pass through
    Sentinel's code. An overflow (a skipped step) is among the steps."""
    import traceback
    import warnings

    torch.manual_seed(0)
    model = TinyGPT(vocab=1024, dim=128, depth=4, heads=4, seq=64).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**16)
    gen = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(gen, 8, 64, 1024, "cuda") for _ in range(4)]
    mon, sender = make_monitor(model, opt, scaler=scaler, update_every=3, state_every=4, health_every=3,
                               memory_every=2)
    ours: list[str] = []
    package = str(Path(sentinel.__file__).parent)
    demo = str(Path(sentinel.__file__).parent / "demo")

    def record(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        frames = [f for f in traceback.extract_stack()[:-1]
                  if f.filename.startswith(package) and not f.filename.startswith(demo)]
        if frames and "synchroniz" in str(message):
            ours.append(f"{frames[-1].filename}:{frames[-1].lineno} ({message})")

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if i == 9:
            next(model.parameters()).grad.view(-1)[0].fill_(float("inf"))  # an fp16 overflow
        scaler.step(opt)
        scaler.update()
        mon.log(loss=loss)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for i in range(16):
                step(i)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    mon.close()
    assert not ours, ours
    assert mon.errors == 0, mon.boundary.failures
    labels = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    assert sender.engine.store.counter("sentinel_amp_skipped_steps_total", labels) == 1
    assert mon.steps == 15  # the overflowed step never reached the optimizer


_HAND_LOOP = r"""
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1)).cuda()
losses = []
for i in range(24):
    if i == 1:  # after the first backward(), when the look for a loop by hand copies its parameters
        torch.cuda.set_sync_debug_mode("error")
    model.zero_grad()
    x = torch.randn(128, 64, device="cuda")
    loss = nn.functional.mse_loss(model(x), x[:, :1])
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(0.01 * p.grad)
    losses.append(loss.detach())
torch.cuda.set_sync_debug_mode("default")
for i, loss in enumerate(losses):
    print(i, f"{loss.item():.6f}")
"""


def test_a_loop_by_hand_on_cuda_is_told_from_an_evaluation_without_a_sync(tmp_path: Path) -> None:
    """A loop without an optimizer is watched once its parameters are seen to change between
    backward() calls; on CUDA that comparison reaches the host behind an event, read at a
    later backward(), never waited for: under the sync debug mode's errors the line saying
    so comes and every later step is reported."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, "-c", _HAND_LOOP], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    said = [ln for ln in out.stderr.splitlines() if "no optimizer" in ln]
    assert len(said) == 1 and "updated by hand" in said[0], out.stderr
    assert "could not watch" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    losses = {int(i) + 1: float(v) for i, v in (ln.split() for ln in out.stdout.splitlines())}
    db = sqlite3.connect(tmp_path / "sentinel" / "history.sqlite")
    samples = dict(db.execute("SELECT step, loss FROM samples"))
    assert len(samples) >= 20 and max(samples) == 24, sorted(samples)
    for step, loss in samples.items():
        assert loss == pytest.approx(losses[step], rel=1e-4)


def test_a_hand_rolled_loss_scale_on_cuda_is_read_without_a_sync() -> None:
    """apex's amp and fairseq multiply a CUDA loss by a Python float: autograd keeps it as a
    CPU scalar, so the scale is read with no sync, and the loss is recorded unscaled."""
    torch.manual_seed(0)
    model = TinyGPT(dim=128, depth=2, seq=64).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    _train(None, model, opt, 2, sync_check=False)
    mon, sender = make_monitor(model, opt, capture_loss=True)
    gen = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(gen, 8, 64, 256, "cuda") for _ in range(6)]
    losses = []
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x, y in batches:
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            (loss.float() * 2.0 ** 16).backward()
            for p in model.parameters():
                p.grad.mul_(2.0 ** -16)
            opt.step()
            losses.append(loss.detach())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    mon.close()
    assert mon.errors == 0, mon.boundary.failures
    got = [f["scalars"]["loss"] for f in sender.steps()]
    assert got == pytest.approx([float(v) for v in losses][:len(got)], rel=1e-5) and len(got) >= 5
