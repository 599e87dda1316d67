"""What docs/frameworks.md promises of the adapters beyond the values test_frameworks.py
compares, each with the real framework on the CPU and the call form as the doc writes it:
Lightning's run name without ``run=`` (the launcher's id, else the logger's
``name/version``), a resumed fit that goes on counting (Lightning and the HF Trainer),
``max_metrics=`` and its default of 16, the close on an exception, and the standalone
``pytorch_lightning`` package. Every value is read where a user reads it: the monitor's
/metrics (scripts/lightning_fit.py)."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import wait_for

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).parent / "scripts"
pl = pytest.importorskip("lightning.pytorch", reason="the frameworks extra: pip install -e '.[frameworks]'")
LAUNCHER_VARS = ("SENTINEL_RUN", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")


@pytest.fixture(scope="module")
def fitting() -> Any:
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield importlib.import_module("lightning_fit")
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


# -- Lightning ------------------------------------------------------------------------------


@pytest.mark.parametrize(("logger", "launcher", "run"), [
    ("csv", None, "expA/version_5"),           # the logger's name/version
    ("default", None, "lightning_logs/version_0"),  # Trainer()'s own logger
    ("csv", "job-7", "job-7"),                 # the launcher's id wins over the logger's
])
def test_lightning_run_name_without_run(fitting: Any, no_launcher: pytest.MonkeyPatch, tmp_path: Path,
                                        logger: str, launcher: str | None, run: str) -> None:
    from lightning.pytorch.loggers import CSVLogger

    from sentinel.integrations.lightning import SentinelCallback

    if launcher is not None:
        no_launcher.setenv("SENTINEL_RUN", launcher)
    cb = SentinelCallback(engine="thread", listen="127.0.0.1:0")  # no run=
    rec = fitting.recorder(pl, cb)
    chosen: Any = CSVLogger(str(tmp_path), name="expA", version=5) if logger == "csv" else True
    fitting.trainer(pl, [cb, rec], max_steps=2, logger=chosen, default_root_dir=str(tmp_path)).fit(
        fitting.module(pl), fitting.data())
    assert [s["run"] for s in rec.seen] == [run, run]


def test_lightning_resumed_fit_goes_on_counting(fitting: Any, tmp_path: Path) -> None:
    from sentinel.integrations.lightning import SentinelCallback

    data = fitting.data(batches=3)  # the checkpoint at the end of epoch 0
    first = fitting.trainer(pl, [SentinelCallback(run="resume-1", engine="off")], max_steps=3)
    first.fit(fitting.module(pl), data)
    ckpt = tmp_path / "step3.ckpt"
    first.save_checkpoint(ckpt)
    cb = SentinelCallback(run="resume-2", engine="thread", listen="127.0.0.1:0")
    rec = fitting.recorder(pl, cb)
    mod = fitting.module(pl)
    fitting.trainer(pl, [cb, rec], max_steps=6).fit(mod, data, ckpt_path=str(ckpt))
    assert [(s["global_step"], s["sentinel_step"]) for s in rec.seen] == [(4, 4.0), (5, 5.0), (6, 6.0)]
    for s in rec.seen:  # each step's loss is the one the module computed at that step
        assert s["sentinel_loss"] == pytest.approx(mod.losses[s["global_step"]], rel=1e-5)


@pytest.mark.parametrize(("options", "count"), [({}, 16), ({"max_metrics": 3}, 3), ({"max_metrics": 0}, 0)])
def test_lightning_max_metrics(fitting: Any, options: dict[str, int], count: int) -> None:
    from sentinel.integrations.lightning import SentinelCallback

    cb = SentinelCallback(run=f"metrics-{count}", engine="thread", listen="127.0.0.1:0", **options)
    rec = fitting.recorder(pl, cb)
    mod = fitting.module(pl, metrics=fitting.METRICS)  # logs 20 step values m00..m19
    fitting.trainer(pl, [cb, rec], max_steps=2).fit(mod, fitting.data())
    for s in rec.seen:
        names = sorted(k for k in s if k.startswith("scalar:"))
        assert len(names) == count, names
        for name in names:  # mI is the step's loss times I+1, as self.log got it
            i = int(name.removeprefix("scalar:m"))
            assert s[name] == pytest.approx(mod.losses[s["global_step"]] * (i + 1), rel=1e-5)


def test_lightning_closes_on_an_exception_and_reports_the_crash(fitting: Any) -> None:
    from sentinel.integrations.lightning import SentinelCallback

    alerts: list[dict[str, Any]] = []
    cb = SentinelCallback(run="crash", engine="thread", listen="127.0.0.1:0", on_alert=alerts.append)
    rec = fitting.recorder(pl, cb)
    mod = fitting.module(pl, fail_at=2)
    with pytest.raises(RuntimeError, match="boom"):
        fitting.trainer(pl, [cb, rec], max_steps=6).fit(mod, fitting.data())
    mon = rec.monitor
    assert cb.monitor is None and mon.closed
    # closed with the exception: the engine records a crash at the last step, not a finished run
    crashed = [a for a in alerts if a["alertname"] == "TrainingCrashed" and a["state_to"] == "firing"]
    assert len(crashed) == 1 and "RuntimeError" in crashed[0]["summary"], alerts
    assert crashed[0]["step"] == 2
    # and its hooks are gone: the optimizer steps on with no monitor behind it
    opt = mod.trainer.optimizers[0]
    steps = mon.steps
    mod.net(torch.ones(1, 8)).sum().backward()
    opt.step()
    assert mon.steps == steps


def test_lightning_validation_sends_heartbeats(fitting: Any) -> None:
    """A validation loop whose ``validation_step`` calls a submodule (no forward of the
    watched LightningModule) still says the fit is alive: the callback beats per batch."""
    from sentinel.integrations.lightning import SentinelCallback

    class Validated(type(fitting.module(pl))):  # type: ignore[misc]
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))
            time.sleep(0.1)  # 8 batches: 0.8 s of validation, no optimizer step

    beats: list[float] = []

    class Probe(pl.Callback):  # type: ignore[misc, name-defined]
        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            beats.extend(_exported_heartbeats(cb.monitor.url))

    cb = SentinelCallback(run="validated", engine="thread", listen="127.0.0.1:0", heartbeat_seconds=0.2)
    started = time.time()
    fitting.trainer(pl, [cb, Probe()], max_steps=2, val_check_interval=2, limit_val_batches=8).fit(
        Validated(), fitting.data(), fitting.data())
    assert len(beats) == 1 and started < beats[0] <= time.time()


def _by_optimizer(url: str, name: str, scalar: str | None = None) -> dict[str, float]:
    """Rank 0's samples of ``name`` on ``url``/metrics (``sentinel_scalar`` of ``scalar``), by ``optimizer``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return {s.labels["optimizer"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name and s.labels.get("rank") == "0" and s.labels.get("name") == scalar}


@pytest.mark.parametrize("g_every", [1, 2])
def test_lightning_manual_optimization_is_a_stream_per_optimizer(fitting: Any, g_every: int) -> None:
    """Lightning's GAN tutorial (manual optimization, two optimizers stepped in turn, each
    with the other's parameters frozen by ``toggle_optimizer``, a ``training_step`` that
    returns nothing): the callback watched both as one stream with no loss, took the
    discriminator's parameters for frozen at the generator's step, never read its gradients,
    and ``GradientsMissing`` (critical) paged the healthy GAN at step 20. Now a stream per
    optimizer, as zero-code mode makes, each player's loss captured at ``manual_backward``,
    and the logged step values with the first stream that stepped in their batch
    (``g_every=2``: a WGAN's generator steps every other batch, and not in the last)."""
    from sentinel.integrations.lightning import SentinelCallback

    alerts: list[dict[str, Any]] = []
    cb = SentinelCallback(run="gan", engine="thread", listen="127.0.0.1:0", on_alert=alerts.append)
    seen: dict[str, dict[str, float]] = {}

    class Probe(pl.Callback):  # type: ignore[misc, name-defined]
        def on_train_end(self, trainer: Any, pl_module: Any) -> None:  # before the callback closes
            url = cb.monitor.url
            wait_for(lambda: _by_optimizer(url, "sentinel_step") == {"0": 25.0 // g_every, "1": 25.0},
                     what="both streams at their last step")
            for name in ("sentinel_grad_norm", "sentinel_loss"):
                seen[name] = _by_optimizer(url, name)
            for scalar in ("g_loss", "d_loss", "objective"):
                seen[scalar] = _by_optimizer(url, "sentinel_scalar", scalar)

    mod = fitting.gan(pl, g_every)
    fitting.trainer(pl, [Probe(), cb], max_epochs=1).fit(mod, fitting.data(batches=25))
    assert (len(mod.grads["generator"]), len(mod.grads["discriminator"])) == (25 // g_every, 25)
    # each stream's gradient norm is its own player's, at its own step
    assert seen["sentinel_grad_norm"]["0"] == pytest.approx(math.sqrt(mod.grads["generator"][-1]), rel=1e-5)
    assert seen["sentinel_grad_norm"]["1"] == pytest.approx(math.sqrt(mod.grads["discriminator"][-1]), rel=1e-5)
    # each player's loss, captured at manual_backward: a game's, so the scalar objective
    assert seen["objective"]["0"] == pytest.approx(mod.losses["generator"][-1], rel=1e-5)
    assert seen["objective"]["1"] == pytest.approx(mod.losses["discriminator"][-1], rel=1e-5)
    assert seen["sentinel_loss"] == {}  # no loss rule judges a player's loss
    # what the module logged, with the first stream that stepped in its batch
    assert seen["g_loss"] == {"0": pytest.approx(mod.losses["generator"][-1], rel=1e-5)}
    d = [pytest.approx(v, rel=1e-5) for v in mod.losses["discriminator"]]
    # g_every=2: the last batch had no generator step, its values went with the discriminator
    assert seen["d_loss"] == ({"0": d[-1]} if g_every == 1 else {"0": d[-2], "1": d[-1]})
    assert not [a for a in alerts if a["state_to"] == "firing"], alerts


def test_standalone_pytorch_lightning_in_process(fitting: Any) -> None:
    """``import pytorch_lightning`` beside ``lightning``: its Trainer drives the callback."""
    standalone = pytest.importorskip("pytorch_lightning")
    result = fitting.fit(standalone, run="pl-both")
    _check_fit(result, "pl-both")


def test_standalone_pytorch_lightning_alone(tmp_path: Path) -> None:
    """Only ``pytorch_lightning`` importable: the adapter falls back to it."""
    pytest.importorskip("pytorch_lightning")
    out = tmp_path / "fit.json"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "lightning_fit.py"), "standalone", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert not result["lightning_imported"]
    assert result["base"].startswith("pytorch_lightning.")
    _check_fit(result, "pl-standalone")


def _check_fit(result: dict[str, Any], run: str) -> None:
    seen = result["seen"]
    assert [(s["global_step"], s["sentinel_step"], s["run"]) for s in seen] == [(k, float(k), run) for k in (1, 2, 3)]
    for s in seen:
        loss = result["losses"][str(s["global_step"])]
        assert s["sentinel_loss"] == pytest.approx(loss, rel=1e-5)
        assert s["scalar:m01"] == pytest.approx(2 * loss, rel=1e-5)


# -- HF Trainer -----------------------------------------------------------------------------


def test_hf_resumed_train_goes_on_counting(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from sentinel.integrations.hf import SentinelCallback

    sys.path.insert(0, str(SCRIPTS))
    try:
        from lightning_fit import exported
    finally:
        sys.path.remove(str(SCRIPTS))

    class Regressor(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}

    g = torch.Generator().manual_seed(0)
    rows = [{"x": x, "labels": x.sum().reshape(1)} for x in torch.randn(64, 8, generator=g)]

    def args(steps: int) -> TrainingArguments:
        return TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=steps,
                                 logging_steps=1, save_strategy="steps", save_steps=3, report_to="none",
                                 use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)

    Trainer(model=Regressor(), args=args(3), train_dataset=rows).train()
    assert (tmp_path / "checkpoint-3").is_dir()
    adapter = SentinelCallback(run="hf-resume", engine="thread", listen="127.0.0.1:0")
    seen: list[tuple[int, float | None, float | None, float]] = []

    class Record(TrainerCallback):  # type: ignore[misc]
        def on_log(self, a: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if not logs or "loss" not in logs or adapter.monitor is None:
                return
            deadline = time.monotonic() + 10
            while True:  # the step's report, then the values the adapter logged for it
                values = exported(adapter.monitor.url)
                if values.get("sentinel_step") == state.global_step and "scalar:learning_rate" in values:
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            seen.append((state.global_step, values.get("sentinel_step"), values.get("sentinel_loss"), logs["loss"]))

    trainer = Trainer(model=Regressor(), args=args(6), train_dataset=rows, callbacks=[adapter, Record()])
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert [(s[0], s[1]) for s in seen] == [(4, 4.0), (5, 5.0), (6, 6.0)]
    for step, _, loss, logged in seen:  # logging_steps=1: the Trainer's loss is the step's
        assert loss == pytest.approx(logged, rel=1e-5), step


def test_hf_evaluation_sends_heartbeats(tmp_path: Path) -> None:
    """An HF evaluation between steps (``eval_strategy="steps"``): a heartbeat per
    ``heartbeat_seconds`` while it runs, read where Prometheus reads it."""
    pytest.importorskip("transformers")
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from sentinel.integrations.hf import SentinelCallback

    class SlowEval(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(8, 1)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            if not self.training:
                time.sleep(0.1)  # 8 evaluation batches: 0.8 s without a step
            return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}

    g = torch.Generator().manual_seed(0)
    rows = [{"x": x, "labels": x.sum().reshape(1)} for x in torch.randn(64, 8, generator=g)]
    adapter = SentinelCallback(run="hf-eval", engine="thread", listen="127.0.0.1:0", heartbeat_seconds=0.2)
    beats: list[float] = []

    class Probe(TrainerCallback):  # type: ignore[misc]
        def on_evaluate(self, a: Any, state: Any, control: Any, **kwargs: Any) -> None:
            beats.extend(_exported_heartbeats(adapter.monitor.url))

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, per_device_eval_batch_size=8,
                             max_steps=2, eval_strategy="steps", eval_steps=2, save_strategy="no", report_to="none",
                             use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
    started = time.time()
    Trainer(model=SlowEval(), args=args, train_dataset=rows, eval_dataset=rows,
            callbacks=[adapter, Probe()]).train()
    assert len(beats) == 1 and started < beats[0] <= time.time()


def _exported_heartbeats(url: str) -> list[float]:
    """``sentinel_last_heartbeat_timestamp_seconds`` as the monitor's /metrics serves it, once
    the evaluation's heartbeat has reached the engine (empty after 10 s without one)."""
    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            text = r.read().decode()
        beats = [s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                 if s.name == "sentinel_last_heartbeat_timestamp_seconds"]
        if beats or time.monotonic() > deadline:
            return beats
        time.sleep(0.05)
