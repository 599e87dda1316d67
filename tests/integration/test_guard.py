"""The step guard end to end (issue 21): from the config (``actions.guard``) through the
embedded engine and through ``sentinel run`` (zero-code, plain and DDP under torchrun),
into the alerts, the capture of the skipped step's batch, the history and ``sentinel skips``.

Real parts only: CPU training, the engine service in a thread or `sentinel run`'s daemon,
SQLite on disk, torchrun with gloo.
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
from prometheus_client.parser import text_string_to_metric_families

import sentinel
from tests.helpers import MLP, retry_gloo_exit_abort, write_config

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).parent / "scripts"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sentinel.cli", *args], capture_output=True, text=True,
                          timeout=180, env=env)


def test_config_guard_skips_alerts_captures_and_lists_the_batch(tmp_path: Path) -> None:
    history = tmp_path / "h.sqlite"
    root = tmp_path / "captures"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05},
                       actions={"guard": {"enabled": True, "warmup": 3}, "capture_on": ["StepSkipped"],
                                "capture_dir": str(root)})
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    fed = {}
    alerts: list[dict] = []
    with sentinel.watch(model, opt, run="g-embedded", listen="127.0.0.1:0", config=cfg, engine="thread",
                        on_alert=alerts.append) as mon:
        assert mon.guard is not None  # from actions.guard
        for step in range(1, 13):
            x = torch.randn(8, 16, generator=gen)
            if step == 7:
                x[3, 5] = float("inf")  # a corrupt sample
            fed[step] = x.clone()
            mon.guard.note_batch(100 + step)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            mon.log(loss=loss)
            assert mon.engine.flush()
        with urllib.request.urlopen(f"{mon.url}/metrics", timeout=10) as r:  # what a cluster Prometheus reads
            metrics = {(s.name, s.labels.get("reason", "")): s.value
                       for fam in text_string_to_metric_families(r.read().decode()) for s in fam.samples
                       if s.name.startswith("sentinel_guard") or s.name == "sentinel_nonfinite_total"}
    assert mon.guard.steps == [7]
    # the exported rules' series (alerts/sentinel.rules.yml): one skip, a run of 1, no outcome
    assert metrics[("sentinel_guard_skipped_total", "nonfinite")] == 1
    assert metrics[("sentinel_guard_skip_run_length", "")] == 1 and metrics[("sentinel_guard_exhausted_total", "")] == 0
    # the Inf in the batch made the loss and the gradients non-finite: counted, not paged,
    # since the step never reached the weights (StepSkipped, info, says so)
    assert metrics[("sentinel_nonfinite_total", "")] >= 1
    assert not [a for a in alerts if a["alertname"] == "TrainingNonFinite"]
    assert all(torch.isfinite(p).all() for p in model.parameters())
    skipped = [a for a in alerts if a["alertname"] == "StepSkipped" and a["state_to"] == "firing"]
    assert len(skipped) == 1 and skipped[0]["severity"] == "info" and skipped[0]["step"] == 7
    assert "batch 107" in skipped[0]["summary"]
    folder = next(p for p in root.glob("*/g-embedded/*-step7-StepSkipped"))
    saved = json.loads((folder / "inputs.rank0.json").read_text())
    assert saved["step"] == 7 and saved["exact"]
    inputs = torch.load(folder / "inputs.rank0.pt", weights_only=True)
    assert torch.equal(inputs["args.0"], fed[7])
    out = cli("skips", "g-embedded", "--db", str(history))
    assert out.returncode == 0, out.stderr
    assert "1 skipped step(s)" in out.stdout and "skip steps: 7" in out.stdout and "skip batches: 107" in out.stdout
    head, row = out.stdout.splitlines()[1:3]
    assert head.split() == ["step", "rank", "reason", "norm", "bound", "batch", "groups"]
    # the groups column: every group whose gradient held the Inf's NaN, by the model's names
    assert row.split(None, 6) == ["7", "0", "nonfinite", "nan", row.split()[4], "107",
                                  "layers.0, layers.1, layers.2, head"], out.stdout


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2 ranks: make test-slow
@retry_gloo_exit_abort
def test_sentinel_run_guards_a_zero_code_script_exactly(tmp_path: Path, ranks: int) -> None:
    """``actions.guard`` reaches the zero-code monitors of every rank; DDP's all-reduce gives
    each rank the NaN, each skips, and every rank ends bit for bit where a run that left
    step K out ends (its scheduler too)."""
    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05},
                       actions={"guard": {"enabled": True}})
    script = [str(SCRIPTS / "guard_train.py"), "12", "6"]
    launcher = ([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", str(ranks)]
                if ranks > 1 else [sys.executable])
    env = dict(os.environ, SENTINEL_RUN=f"g-run-{ranks}")
    env.pop("SENTINEL_GUARD", None)
    ref = subprocess.run([*launcher, *script, str(tmp_path / "ref"), "reference"], capture_output=True, text=True,
                         timeout=180)
    assert ref.returncode == 0, ref.stderr
    res = cli("run", "--config", cfg, "--listen", "127.0.0.1:0", "--", *launcher, *script, str(tmp_path / "got"),
              env=env)
    assert res.returncode == 0, res.stderr
    for r in range(ranks):
        want = torch.load(tmp_path / f"ref.rank{r}.pt", weights_only=True)
        got = torch.load(tmp_path / f"got.rank{r}.pt", weights_only=True)
        assert all(torch.equal(want[n], got[n]) for n in want), f"rank {r}"
    out = cli("skips", f"g-run-{ranks}", "--db", str(history))
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("6 ")]
    assert len(lines) == ranks and all("nonfinite" in ln for ln in lines), out.stdout
    assert "skip batches: not exposed" in out.stdout
    # the daemon's verdicts, as stored: the kept-out NaN is an info, not a page
    with sqlite3.connect(history) as db:
        fired = set(db.execute("SELECT alertname, severity, step FROM alerts WHERE state_to = 'firing'"))
    assert ("StepSkipped", "info", 6) in fired, fired
    assert not [a for a in fired if a[0] == "TrainingNonFinite"], fired


@pytest.mark.slow  # make test-slow: two torchrun jobs of FSDP2
@retry_gloo_exit_abort
def test_sentinel_run_guard_skips_an_fsdp_step_on_every_rank_when_one_shard_is_bad(tmp_path: Path) -> None:
    """docs/guard.md: under FSDP each rank holds only its shards' sums, so the guard takes one
    all-reduce of a scalar a step: a NaN in rank 1's shard alone makes both ranks skip, and
    the model ends bit for bit where a run that left step K out on both ranks ends."""
    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05},
                       actions={"guard": {"enabled": True}})
    launcher = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", "2"]
    script = [str(SCRIPTS / "fsdp_guard_train.py"), "10", "6"]
    ref = subprocess.run([*launcher, *script, str(tmp_path / "ref"), "reference"], capture_output=True, text=True,
                         timeout=180)
    assert ref.returncode == 0, ref.stderr
    env = dict(os.environ, SENTINEL_RUN="g-fsdp")
    env.pop("SENTINEL_GUARD", None)
    res = cli("run", "--config", cfg, "--listen", "127.0.0.1:0", "--", *launcher, *script, str(tmp_path / "got"),
              env=env)
    assert res.returncode == 0, res.stderr
    want = torch.load(tmp_path / "ref.pt", weights_only=True)
    got = torch.load(tmp_path / "got.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in got.values())
    assert all(torch.equal(want[n], got[n]) for n in want), {n: (want[n] - got[n]).abs().max() for n in want}
    out = cli("skips", "g-fsdp", "--db", str(history))
    assert out.returncode == 0, out.stderr
    lines = [ln.split() for ln in out.stdout.splitlines() if ln.startswith("6 ")]
    assert sorted(ln[1] for ln in lines) == ["0", "1"] and all(ln[2] == "nonfinite" for ln in lines), out.stdout


def _guard_run(guard: object, k: int | None, take_step_k: bool = True) -> tuple[dict[str, torch.Tensor], dict, dict,
                                                                                  sentinel.Monitor | None, dict]:
    """AdamW and a StepLR on MLP for 10 steps; a NaN in one gradient element at step ``k``.
    ``guard`` None: no monitor. Returns the weights, the optimizer's and the scheduler's
    state, the monitor and what its /metrics said of the guard at the end."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    mon = None if guard is None else sentinel.watch(model, opt, guard=guard, engine="thread", listen="127.0.0.1:0")
    gen = torch.Generator().manual_seed(1)
    for step in range(1, 11):
        x = torch.randn(8, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        if step == k:
            model.layers[1][0].weight.grad[2, 3] = float("nan")
            if not take_step_k:
                continue  # the reference: step k's optimizer.step() and scheduler.step() never called
        opt.step()
        sched.step()
        if mon is not None:
            mon.log(loss=loss)
    exported: dict = {}
    if mon is not None:
        assert mon.engine.flush()
        with urllib.request.urlopen(f"{mon.url}/metrics", timeout=10) as r:
            exported = {(s.name, s.labels.get("reason", "")): s.value
                        for fam in text_string_to_metric_families(r.read().decode()) for s in fam.samples
                        if s.name.startswith("sentinel_guard")}
        mon.close()
    weights = {n: t.detach().clone() for n, t in model.state_dict().items()}
    return weights, opt.state_dict(), sched.state_dict(), mon, exported


@pytest.mark.parametrize("guard", [True, {"factor": 20, "max_consecutive": 4, "on_exhausted": "through"}])
def test_watch_guard_keeps_a_nan_gradient_out_as_if_the_step_was_not_taken(
        guard: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/guard.md's ``sentinel.watch(model, opt, guard=...)``, both forms as written: the
    step with a NaN gradient leaves the weights, AdamW's moments and step counters and the
    scheduler bit for bit where a run that never called that step's ``optimizer.step()``
    (nor ``scheduler.step()``) has them, and training goes on; the skip is counted."""
    monkeypatch.delenv("SENTINEL_GUARD", raising=False)
    k = 6
    want, want_opt, want_sched, _, _ = _guard_run(None, k, take_step_k=False)
    got, got_opt, got_sched, mon, exported = _guard_run(guard, k)
    assert mon is not None and mon.guard is not None
    assert mon.guard.steps == [k] and mon.guard.skipped == {"nonfinite": 1, "spike": 0}
    assert all(torch.equal(want[n], got[n]) for n in want)
    assert got_sched == want_sched
    assert got_opt["param_groups"] == want_opt["param_groups"]
    for pid, state in want_opt["state"].items():
        for key, value in state.items():
            assert torch.equal(got_opt["state"][pid][key], value), (pid, key)
    assert exported[("sentinel_guard_skipped_total", "nonfinite")] == 1
    # the baseline: unguarded, the NaN reaches the weights
    unguarded, _, _, _, _ = _guard_run(None, k)
    assert not all(torch.isfinite(t).all() for t in unguarded.values())
