"""The frameworks people train with, run for real on the CPU: Lightning's Trainer, the HF
Trainer, Accelerate, ``torch.optim.LBFGS`` and a plain loop with four backward calls per
step. Each runs with its adapter or ``sentinel.watch`` (in this process, the engine in a
thread; Accelerate both with ``mon.log`` and with ``capture_loss=True`` and no log) and unmodified under ``sentinel run`` (zero-code). At every step before the fault
the exported ``sentinel_grad_norm`` equals the reference taken where the framework's
gradients are final, ``sentinel_grad_norm_preclip`` the framework's own norm where it
clips, ``sentinel_loss`` the framework's loss, ``sentinel_scalar`` what the adapter
passes on (Lightning's ``self.log``, the HF Trainer's ``learning_rate`` and ``grad_norm``); a NaN injected at step 4, in the loss or in
the gradients only, fires ``TrainingNonFinite`` at step 4.

The scripts (``scripts/frameworks_train.py``) take the references and poll their own
monitor's /metrics after each optimizer step; the test compares what they wrote.
"""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import write_config

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).parent / "scripts"
FAULT_STEP = 4
FAULTS = ("grad", "loss")
REL = 1e-5
CLIPS = {"accelerate", "accelerate_capture", "lightning_clip", "lightning_accum_clip", "hf"}
SCALARS = {"lightning": ("train_mse",), "lightning_accum": ("train_mse",), "lightning_clip": ("train_mse",),
           "lightning_accum_clip": ("train_mse",), "hf": ("learning_rate", "grad_norm")}
RUNS = {"plain4": "plain4", "lbfgs": "lbfgs", "accelerate": "accelerate", "accelerate_capture": "accelerate_capture",
        "lightning": "lightning-1-None", "lightning_accum": "lightning-2-None", "lightning_clip": "lightning-1-0.05",
        "lightning_accum_clip": "lightning-2-0.05", "hf": "hf-tiny-gpt2"}
ADAPTER_CASES = list(RUNS)
# under `sentinel run` each case is a fresh Python that imports its framework: the cases
# that together cover closures, accumulation and clipping in every framework
ZERO_CODE_CASES = [pytest.param("plain4", marks=pytest.mark.slow), pytest.param("lbfgs", marks=pytest.mark.slow),
                   "accelerate", "lightning_accum_clip", "hf"]  # plain and LBFGS scripts: the zoo has them too

for _name in ("lightning", "transformers", "accelerate"):
    pytest.importorskip(_name, reason="the frameworks extra: pip install -e '.[frameworks]'")


def _mismatches(result: dict[str, Any], case: str, adapter: bool) -> list[str]:
    """Every exported value before the fault step that is not its reference."""
    bad = []
    if result["error"]:
        return [result["error"]]
    checks = [("sentinel_grad_norm", "grad_norm"), ("sentinel_loss", "loss")]
    if case in CLIPS:
        checks.append(("sentinel_grad_norm_preclip", "preclip"))
    if adapter and case in SCALARS:
        checks += [(f"scalar:{name}",) * 2 for name in SCALARS[case]]
    for step in range(1, FAULT_STEP):
        ref, got = result["refs"].get(str(step), {}), result["exported"].get(str(step), {})
        for exported, reference in checks:
            want, have = ref.get(reference), got.get(exported)
            if want is None or have is None or have != pytest.approx(want, rel=REL):
                bad.append(f"step {step}: {exported} = {have}, reference {reference} = {want}")
        if adapter and got.get("run") != RUNS[case]:
            bad.append(f"step {step}: run label {got.get('run')!r}, expected {RUNS[case]!r}")
    if case in CLIPS:  # the reference really clipped, so pre- and post-clip norms differ
        ref1 = result["refs"]["1"]
        assert ref1["preclip"] > 1.5 * ref1["grad_norm"], ref1
    return bad


def _check(result: dict[str, Any], case: str, fault: str, adapter: bool) -> None:
    bad = _mismatches(result, case, adapter)
    alerts = [a for a in result["alerts"] if a["alertname"] == "TrainingNonFinite"]
    if not alerts:
        bad.append(f"no TrainingNonFinite after a NaN in the {fault} at step {FAULT_STEP}")
    elif alerts[0]["step"] != FAULT_STEP:
        bad.append(f"TrainingNonFinite at step {alerts[0]['step']}, the NaN ({fault}) was at step {FAULT_STEP}")
    assert not bad, f"{case}, NaN in the {fault}:\n" + "\n".join(bad)


@pytest.fixture(scope="module")
def cases() -> Any:
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield importlib.import_module("frameworks_train")
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("case", ADAPTER_CASES)
def test_adapter_or_watch_exports_the_frameworks_values(cases: Any, case: str, fault: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    cases.run(case, fault, str(out), watch=True)
    _check(json.loads(out.read_text()), case, fault, adapter=True)


@pytest.mark.parametrize("case", ZERO_CODE_CASES)
def test_sentinel_run_exports_the_frameworks_values(case: str, tmp_path: Path) -> None:
    # one script trains twice (NaN in the gradients, then in the loss), as two runs
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                           sys.executable, str(SCRIPTS / "frameworks_train.py"), case, str(tmp_path), *FAULTS],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    bad = []
    for fault in FAULTS:
        try:
            _check(json.loads((tmp_path / f"{fault}.json").read_text()), case, fault, adapter=False)
        except AssertionError as e:
            bad.append(str(e))
    assert not bad, "\n".join(bad)


@pytest.mark.slow  # 17-41 s: behind the marker, to keep `make test` well under its 20 minutes
def test_a_script_started_by_accelerate_launch_keeps_the_run(tmp_path: Path) -> None:
    """``sentinel run -- accelerate launch script.py``: the CLI imports torch and runs the
    script as a process of its own; the training is the run (it was reported as a program
    the CLI ran, ``RUN-accelerate_launched``, beside an empty run of 0 steps)."""
    launch = str(Path(sys.executable).with_name("accelerate"))
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "SENTINEL_RUN": "acc", "HF_HUB_OFFLINE": "1"}
    args = [launch, "launch", "--cpu", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", str(SCRIPTS / "accelerate_launched.py"), "40"]
    plain = subprocess.run(args, capture_output=True, text=True, timeout=240, env=env)
    proc = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--", *args],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == plain.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout == plain.stdout and proc.stdout.startswith("done: ")
    db = sqlite3.connect(tmp_path / "state" / "sentinel" / "history.sqlite")
    rows = db.execute("SELECT run, steps, state FROM runs").fetchall()
    assert rows == [("acc", 40, "finished")], rows


def test_importing_sentinel_imports_no_framework() -> None:
    code = ("import sys, sentinel, sentinel.integrations; sentinel.watch; "
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'accelerate') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_an_epochs_shorter_accumulation_under_the_hf_trainer_is_its_loss(tmp_path: Path) -> None:
    """docs/instrumenting.md: a step with fewer ``backward()`` calls than the first keeps
    its sum, which the HF Trainer makes that step's mean (it divides by the step's own
    count). Under ``sentinel run``, every step's loss in the history is the Trainer's own,
    the 1-micro-batch steps (2, 4, 6) among the 4-micro-batch ones included."""
    pytest.importorskip("transformers")
    db = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(db), "flush_seconds": 0.1})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "SENTINEL_RUN": "partial"}
    proc = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen",
                           "127.0.0.1:0", "--", sys.executable, str(SCRIPTS / "hf_partial_accumulation.py"),
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    theirs = {int(w[1]): float(w[2]) for w in (line.split() for line in proc.stdout.splitlines()) if w[:1] == ["loss"]}
    assert sorted(theirs) == [1, 2, 3, 4, 5, 6], proc.stdout
    with sqlite3.connect(db) as con:
        ours = dict(con.execute("SELECT step, loss FROM samples"))
    assert ours == pytest.approx(theirs, rel=1e-6), (ours, theirs)


@pytest.mark.parametrize(("mode", "epochs", "tuner_steps", "fit_steps"),
                         [("batch-size", "3", 15, 384), ("lr", "1", 4, 512)])
@pytest.mark.slow  # 17-41 s: behind the marker, to keep `make test` well under its 20 minutes
def test_a_fit_after_lightnings_tuner_is_judged_on_its_own_losses(tmp_path: Path, mode: str, epochs: str,
                                                                  tuner_steps: int, fit_steps: int) -> None:
    """Lightning's tuner (scripts/lightning_tuned.py), then the fit, under ``sentinel run``.
    The batch-size finder: 5 trials of 3 steps at batch sizes 2 to 32 with the model's Adam,
    the initial weights restored, then the fit; the restore marks the step after it
    (``load_state_dict``), and the early-phase rules judge the fit's losses from there:
    judged against the trials' first losses at other batch sizes, the fit's paged a
    critical EarlyLossRising at step 50. The lr finder (stopped after 4 steps by its noisy
    first losses), then a fit at batch 8 whose batches' losses span 4-22: its median 1.3×
    its start at step 56 by chance paged it too. The stream goes on (the tuner's steps,
    then the fit's), every fit loss the one Lightning computed."""
    pytest.importorskip("lightning")
    script = [sys.executable, str(SCRIPTS / "lightning_tuned.py"), mode, epochs]
    plain = subprocess.run(script, capture_output=True, text=True, timeout=240)
    assert plain.returncode == 0, plain.stderr[-4000:]
    db = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(db), "flush_seconds": 0.1})
    proc = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen", "127.0.0.1:0",
                           "--", *script], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "SENTINEL_RUN": "tuned"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout == plain.stdout
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("sentinel:") and "metrics at" not in ln] == []
    theirs = {int(w[1]): float(w[2]) for w in (line.split() for line in plain.stdout.splitlines()) if w[:1] == ["loss"]}
    assert sorted(theirs) == list(range(1, fit_steps + 1))
    with sqlite3.connect(db) as con:
        runs = con.execute("SELECT steps, state FROM runs WHERE run = 'tuned'").fetchall()
        ours = dict(con.execute("SELECT step, loss FROM samples WHERE step > ?", (tuner_steps,)))
        fired = con.execute("SELECT alertname FROM alerts WHERE state_to = 'firing' AND severity != 'info'").fetchall()
    assert runs == [(tuner_steps + fit_steps, "finished")]
    assert fired == []
    assert ours == {tuner_steps + k: v for k, v in theirs.items()}
