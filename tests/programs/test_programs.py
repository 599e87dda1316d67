"""The zoo: training programs shaped like widely used public ones (nanoGPT's trainer, the
PyTorch examples' DCGAN, the original WGAN, word_language_model, time_sequence_prediction, mnist/imagenet,
DDP, functorch, WGAN-GP, mnist_hogwild, CleanRL's PPO, the examples' VAE, SAM, PGD
adversarial training, the HF examples' logging set-up, the neural style transfer tutorial,
CleanRL's SAC, the DQN tutorial, SGDR's CIFAR scripts, SNGAN, the lottery-ticket scripts, CycleGAN,
YOLOv5's trainer, a small DDPM, a sparse mixture of experts, Hugging Face's re-entrant
gradient checkpointing, ZeroRedundancyOptimizer, loralib's LoRA, the DDP tutorial's mp.spawn,
ULMFiT's gradual unfreezing, PCGrad's gradient surgery, SwAV's LARC, fast neural style,
litgpt's Fabric loop, StyleGAN2's lazy regularization, apex amp's loss scaler, Opacus's
DP-SGD, tensor parallelism), each run
plainly, under ``sentinel run`` (zero-code) and, where people use it that way, with
``sentinel.watch``. Issue 18's contract, for every program:

- the exit status and stdout are the same with and without Sentinel (the programs print
  their losses with ``repr`` and their final weights' checksum, so equal stdout is
  bit-identical training), and so are the reference values the programs record;
- every file it saves loads in a Python where ``import sentinel`` fails, and equals the
  file saved without Sentinel (same keys, same tensors, no hooks, no added attributes);
- Sentinel's loss, gradient norm (pre- and post-clip) and step count equal the references
  the program took where its gradients are final;
- nothing of Sentinel's reaches stderr (no traceback, no warning) but its one address line
  (and, without an optimizer, one line saying what cannot be watched; with a NaN, its
  alert's line);
- no warning or critical alert fires on these clean runs;
- in a job of several ranks (torchrun's, or the program's own ``mp.spawn``) every rank
  reports every step under the run's one name.

Each program runs once per module (all its modes at once); the tests below read the cached
outcome, one aspect each, so one run shows every aspect that fails.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from tests.programs.harness import Program, Run, extra_stderr, load_files, run_program, samples

# minutes of real time (each program runs two or three times): `make test-slow`, which .ci/run runs
pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROGRAMS = [
    Program("chargpt", "chargpt.py", watch=True, opt="AdamW"),
    Program("dcgan", "dcgan.py", optimizers=2, opt="Adam", objective=(0, 1)),
    Program("wgan", "wgan.py", optimizers=2, opt="RMSprop", objective=(0, 1)),
    Program("lbfgs_seq", "lbfgs_seq.py", watch=True, opt="LBFGS"),
    Program("rnn_lm_sgd", "rnn_lm.py", optimizers=0),
    Program("rnn_lm_sgd_nan", "rnn_lm.py", ("--nan-at", "5"), optimizers=0, nan_at=5),
    Program("rnn_lm_adamw", "rnn_lm.py", ("--optimizer", "adamw"), watch=True, opt="AdamW"),
    Program("classifier_steplr", "classifier.py", opt="SGD"),
    Program("classifier_onecycle", "classifier.py", ("--sched", "onecycle"), slow=True, opt="SGD"),
    Program("compiled", "compiled.py", ("--backend", "aot_eager"), watch=True, slow=True, opt="AdamW"),
    Program("compiled_late", "compiled.py", ("--backend", "aot_eager", "--late", "2"), watch=True, slow=True,
            opt="AdamW"),
    Program("compiled_step", "compiled.py", ("--backend", "aot_eager", "--compile-step"), watch=True, slow=True,
            opt="AdamW"),
    Program("bf16_autocast", "bf16_autocast.py", opt="SGD"),
    Program("cast_after_watch", "cast_after_watch.py", watch=True, rel=2e-3, opt="SGD"),
    Program("dataloader_workers", "dataloader_workers.py", opt="Adam"),
    Program("mp_pool", "mp_pool.py", opt="SGD"),
    Program("best_model_export", "best_model_export.py", watch=True, opt="Adam"),
    Program("ddp_single", "ddp_single.py", opt="Adam"),
    Program("ddp_torchrun", "ddp_single.py", ranks=2, slow=True, opt="Adam"),
    Program("ddp_no_sync", "ddp_single.py", ("4", "2"), opt="Adam"),
    Program("ddp_no_sync_torchrun", "ddp_single.py", ("4", "2"), ranks=2, slow=True, opt="Adam"),
    Program("functional_call", "functional_call.py", opt="AdamW"),
    Program("autograd_grad", "autograd_grad.py", opt="Adam"),
    Program("mixed_dtypes", "mixed_dtypes.py", watch=True, opt="Adam"),
    Program("float64", "mixed_dtypes.py", ("--dtype", "float64"), slow=True, opt="Adam"),
    Program("complex", "mixed_dtypes.py", ("--dtype", "complex"), opt="Adam"),
    Program("hogwild", "hogwild.py", optimizers=2, opt="SGD"),
    Program("swa_plateau", "swa_plateau.py", watch=True, opt="SGD"),
    Program("sparse_embedding", "sparse_embedding.py", watch=True, optimizers=2, opt="SparseAdam"),
    Program("ppo", "ppo.py", watch=True, opt="Adam"),
    Program("vae_elbo", "vae_elbo.py", watch=True, opt="Adam"),
    Program("sam", "sam.py", watch=True, opt="SGD"),
    Program("logging_setup", "logging_setup.py", opt="AdamW"),
    Program("finetune_unfreeze", "finetune_unfreeze.py", opt="Adam"),
    Program("adversarial", "adversarial.py", opt="SGD"),
    Program("neural_style", "neural_style.py", watch=True, opt="LBFGS"),
    Program("sac", "sac.py", watch=True, optimizers=3, opt="Adam", objective=(0, 1, 2)),
    Program("dqn", "dqn.py", watch=True, opt="AdamW", objective=(0,)),
    Program("sgdr", "sgdr.py", watch=True, opt="SGD"),
    Program("optimizer_in_backward", "optimizer_in_backward.py", watch=True, opt="AdamW"),
    Program("sngan", "sngan.py", watch=True, optimizers=2, opt="Adam", objective=(0, 1)),
    Program("lottery", "lottery.py", opt="Adam"),
    Program("cyclegan", "cyclegan.py", optimizers=2, opt="Adam", objective=(0, 1)),
    Program("yolo_warmup", "yolo_warmup.py", opt="SGD"),
    Program("ddpm", "ddpm.py", watch=True, opt="AdamW"),
    Program("moe", "moe.py", watch=True, opt="Adam"),
    Program("checkpointed", "checkpointed.py", ("80",), watch=True, opt="AdamW"),
    Program("zero", "zero.py", opt="ZeroRedundancyOptimizer"),
    Program("lora", "lora.py", watch=True, opt="AdamW"),
    Program("ddp_spawn", "ddp_spawn.py", spawns=2, opt="SGD"),
    Program("gradual_unfreeze", "gradual_unfreeze.py", watch=True, opt="AdamW"),
    Program("pcgrad", "pcgrad.py", watch=True, opt="Adam"),
    Program("swav", "swav.py", watch=True, opt="SGD", first_unread=True),
    Program("fast_style", "fast_style.py", watch=True, opt="Adam"),
    Program("fabric_gpt", "fabric_gpt.py", watch=True, opt="AdamW"),
    Program("fabric_ddp", "fabric_gpt.py", ("40", "--devices", "2"), spawns=2, slow=True, opt="AdamW"),
    Program("stylegan2", "stylegan2.py", watch=True, optimizers=2, opt="Adam", objective=(0, 1), stepped=(1, 0)),
    Program("zero_torchrun", "zero.py", ranks=2, slow=True, opt="ZeroRedundancyOptimizer"),
    Program("apex_amp", "apex_amp.py", watch=True, opt="AdamW"),
    Program("dp_sgd", "dp_sgd.py", watch=True, opt="SGD"),
    Program("dp_sgd_physical", "dp_sgd.py", ("4", "24"), watch=True, opt="SGD"),
    Program("tensor_parallel", "tensor_parallel.py", ranks=2, slow=True, opt="AdamW"),
]
BY_ID = {p.id: p for p in PROGRAMS}
MODES = ["run", "watch"]
_CACHE: dict[str, dict[str, Run]] = {}


def _params() -> list[Any]:
    out = []
    for p in PROGRAMS:
        for mode in [m for m in MODES if m == "run" or p.watch]:
            marks = [pytest.mark.zoo_slow] if p.slow else []
            out.append(pytest.param(p.id, mode, id=f"{p.id}-{mode}", marks=marks))
    return out


def _programs(several: bool = False, ranks: bool = False) -> list[Any]:
    return [pytest.param(p.id, id=p.id, marks=[pytest.mark.zoo_slow] if p.slow else [])
            for p in PROGRAMS if (not several or p.optimizers > 1) and (not ranks or max(p.ranks, p.spawns) > 1)]


@pytest.fixture
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Any:
    def get(pid: str) -> dict[str, Run]:
        if pid not in _CACHE:
            reuse = os.environ.get("ZOO_REUSE_DIR")  # keep the runs' folders, to work on the tests
            tmp = Path(reuse) / pid if reuse else tmp_path_factory.mktemp(pid)
            tmp.mkdir(parents=True, exist_ok=True)
            _CACHE[pid] = run_program(BY_ID[pid], tmp)
        return _CACHE[pid]
    return get


def _close(a: float | None, b: float | None, rel: float) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def _stored(a: float | None, b: float | None, rel: float) -> bool:
    """As :func:`_close`, for a history value: SQLite stores a non-finite value as NULL (the
    run's ``nonfinite`` count says it was seen)."""
    if a is None and b is not None and not math.isfinite(b):
        return True
    return _close(a, b, rel)


def _summary(run: Run) -> str:
    last = next((line for line in reversed(run.stderr.splitlines()) if line.strip()), "")
    return f"{run.mode}: exit {run.returncode}, last stderr line {last[:300]!r}; stderr tail:\n{run.stderr[-1500:]}"


# --- the program itself is untouched ---------------------------------------------------


@pytest.mark.parametrize(("pid", "mode"), _params())
def test_exit_status_and_stdout_are_the_programs(outcome: Any, pid: str, mode: str) -> None:
    runs = outcome(pid)
    plain, other = runs["plain"], runs[mode]
    assert plain.returncode == 0, _summary(plain)
    assert other.returncode == plain.returncode, _summary(other)
    assert other.stdout == plain.stdout, f"{mode}: stdout differs\n--- plain\n{plain.stdout}\n--- {mode}\n{other.stdout}"


@pytest.mark.parametrize(("pid", "mode"), _params())
def test_training_is_bit_identical(outcome: Any, pid: str, mode: str) -> None:
    runs = outcome(pid)
    plain, other = runs["plain"], runs[mode]
    assert plain.ref is not None and other.ref is not None, _summary(other)
    # as JSON text: NaN (a poisoned step) equals NaN there
    assert json.dumps(other.ref["optimizers"]) == json.dumps(plain.ref["optimizers"]), "the reference values differ"
    checks = [line for line in plain.stdout.splitlines() if line.startswith("checksum ")]
    assert checks and checks == [line for line in other.stdout.splitlines() if line.startswith("checksum ")]


@pytest.mark.parametrize(("pid", "mode"), _params())
def test_saved_files_load_without_sentinel_and_equal_the_plain_ones(outcome: Any, pid: str, mode: str) -> None:
    runs = outcome(pid)
    if not runs["plain"].digested:  # every program run so far, in one Python
        load_files([r for r in _CACHE.values() if not r["plain"].digested])
    plain, other = runs["plain"].saved(), runs[mode].saved()
    assert plain, "the plain run saved nothing"
    assert sorted(other) == sorted(plain), f"saved files differ: {sorted(other)} vs {sorted(plain)}"
    errors = {name: e["error"] for name, e in other.items() if "error" in e}
    assert not errors, f"{mode}: saved files that do not load without sentinel: {errors}"
    for name, entry in plain.items():
        assert "error" not in entry, f"the plain run's {name} does not load: {entry['error']}"
        assert other[name]["weights_only"] == entry["weights_only"], f"{name}: weights_only load differs"
        assert other[name]["digest"] == entry["digest"], f"{name}: contents differ from the plain run's"


# --- nothing of Sentinel reaches the user --------------------------------------------------


@pytest.mark.parametrize(("pid", "mode"), _params())
def test_no_traceback_or_warning_from_sentinel(outcome: Any, pid: str, mode: str) -> None:
    runs = outcome(pid)
    extra = extra_stderr(runs["plain"].stderr, runs[mode].stderr)
    allowed = [line for line in extra if line.startswith("sentinel: metrics at http://127.0.0.1:")]
    rest = [line for line in extra if line not in allowed]
    if BY_ID[pid].optimizers == 0 and mode == "run":
        said = [line for line in rest if line.startswith("sentinel:") and "optimizer" in line]
        assert len(said) == 1, f"one line must say what cannot be watched without an optimizer: {rest}"
        rest.remove(said[0])
    if BY_ID[pid].nan_at:  # the NaN's alert: one line on the console (docs/alerting.md), and its resolve's
        fired = [line for line in rest if line.startswith("sentinel: [FIRING] critical TrainingNonFinite — ")]
        resolved = [line for line in rest if line.startswith(("sentinel: [RESOLVED] critical TrainingNonFinite — ",
                                                              "sentinel: [ENDED] critical TrainingNonFinite — "))]
        assert len(fired) == 1 and len(resolved) <= 1, f"the NaN's alert and its close, a line each: {rest}"
        rest = [line for line in rest if line not in fired + resolved]
    assert not rest, (f"{mode}: Sentinel printed {len(rest)} lines on stderr, first: {rest[0][:200]!r}; "
                      f"tracebacks: {sum('Traceback' in line for line in rest)}\n" + "\n".join(rest[:40]))


@pytest.mark.parametrize(("pid", "mode"), _params())
def test_no_warning_or_critical_alert_on_a_clean_run(outcome: Any, pid: str, mode: str) -> None:
    if BY_ID[pid].nan_at:
        pytest.skip("not a clean run: see test_a_nan_without_an_optimizer_fires_training_nonfinite")
    run = outcome(pid)[mode]
    fired = []
    if run.history is not None:
        fired += [f"{a['alertname']} ({a['severity']}, step {a['step']}): {a['summary']}"
                  for a in run.history["alerts"] if a["state_to"] == "firing"
                  and a["severity"] in ("warning", "critical")]
    if run.snapshot is not None:
        fired += [f"{a['alertname']} ({a.get('severity')}, /api/v1/alerts): {a.get('summary')}"
                  for a in run.snapshot["alerts"] if a.get("state") == "firing"
                  and a.get("severity") in ("warning", "critical")]
    fired = sorted(set(fired))
    assert not fired, f"{mode}: {len(fired)} alerts on a clean run: " + " | ".join(fired)


# --- Sentinel's numbers are the program's --------------------------------------------------


def _history_rows(run: Run) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    assert run.history is not None, f"{run.mode}: no history file"
    runs = run.history["runs"]
    assert len(runs) == 1, f"{run.mode}: history rows for the run: {[(r['run'], r['state']) for r in runs]}"
    return runs[0], [s for s in run.history["samples"] if s["run_id"] == runs[0]["id"]]


@pytest.mark.parametrize(("pid", "mode"), _params())
def test_history_holds_the_references_step_by_step(outcome: Any, pid: str, mode: str) -> None:
    """The history's samples: one per step (optimizer step, or backward() without an
    optimizer), the step's loss, its final gradient norm and, where the program clips,
    the norm before clipping."""
    prog = BY_ID[pid]
    if prog.optimizers > 1:
        pytest.skip("several optimizers: the per-optimizer streams are checked on /metrics")
    run = outcome(pid)[mode]
    assert run.ref is not None, _summary(run)
    steps = run.ref["optimizers"][0]
    row, rows = _history_rows(run)
    bad = []
    if row["steps"] != len(steps):
        bad.append(f"runs.steps = {row['steps']}, the program made {len(steps)} steps")
    if mode == "run" and (row["state"], row["exit_status"]) != ("finished", 0):
        bad.append(f"run state {row['state']!r}, exit status {row['exit_status']}")
    by_step = {s["step"]: s for s in rows}
    for i, ref in enumerate(steps, start=1):
        got = by_step.get(i)
        if got is None:
            bad.append(f"step {i}: no sample")
            continue
        if 0 in prog.objective:  # no loss to judge: the scalar objective (test_metrics_show_every_step...)
            if got["loss"] is not None:
                bad.append(f"step {i}: loss {got['loss']!r}, want none (the value is the objective)")
        elif not _stored(got["loss"], ref["loss"], 1e-5):
            bad.append(f"step {i}: loss {got['loss']!r}, reference {ref['loss']!r}")
        if i == 1 and prog.first_unread:
            if got["grad_norm"] is not None:
                bad.append(f"step 1: grad_norm {got['grad_norm']!r}, want none (the wrapper had scaled them)")
        elif not _stored(got["grad_norm"], ref["grad_norm"], prog.rel):
            bad.append(f"step {i}: grad_norm {got['grad_norm']!r}, reference {ref['grad_norm']!r}")
        if ref["preclip"] is not None and not _stored(got["clip_norm"], ref["preclip"], prog.rel):
            bad.append(f"step {i}: pre-clip norm {got['clip_norm']!r}, reference {ref['preclip']!r}")
    assert not bad, f"{mode}: {len(bad)} mismatches: " + "; ".join(bad[:12])


@pytest.mark.parametrize(("pid", "mode"), [p for p in _params() if BY_ID[p.values[0]].opt])
def test_history_names_the_optimizer(outcome: Any, pid: str, mode: str) -> None:
    """Issue 18, point 7: the history's run row holds the optimizer class from the frames
    (``sentinel runs``/``compare`` show it), with no tags passed."""
    row, _ = _history_rows(outcome(pid)[mode])
    assert BY_ID[pid].opt in (row["optimizer"] or ""), f"{mode}: runs.optimizer = {row['optimizer']!r}"


@pytest.mark.parametrize("pid", _programs(ranks=True))
def test_every_rank_reports_every_step_under_one_run_name(outcome: Any, pid: str) -> None:
    """A job of several ranks, started by torchrun or by the script itself (``mp.spawn``,
    with no ``RANK`` in the environment): /metrics holds each rank once, all under the
    run's one name, each at the program's step count."""
    prog = BY_ID[pid]
    run = outcome(pid)["run"]
    assert run.snapshot is not None and run.ref is not None, _summary(run)
    steps = {lab.get("rank"): v for lab, v in samples(run.snapshot["metrics"], "sentinel_step", f"zoo-{pid}")}
    world = max(prog.ranks, prog.spawns)
    assert steps == {str(r): len(run.ref["optimizers"][0]) for r in range(world)}, steps


@pytest.mark.parametrize("pid", [p for p in _programs() if p.values[0] in ("zero", "zero_torchrun")])
def test_a_sharded_optimizer_is_one_stream_and_each_rank_exports_the_state_it_holds(outcome: Any, pid: str) -> None:
    """README: an optimizer stepping another inside its ``step()`` (ZeroRedundancyOptimizer)
    is one stream, and each rank's optimizer state is what it holds: AdamW's ``exp_avg``
    over the ranks adds up to the model's parameter bytes, a share on each rank."""
    prog, name = BY_ID[pid], f"zoo-{pid}"
    run = outcome(pid)["run"]
    assert run.snapshot is not None, _summary(run)
    text = run.snapshot["metrics"]
    steps = samples(text, "sentinel_step", name)
    assert steps and not [lab for lab, _ in steps if "optimizer" in lab], steps  # one stream: no label
    held = {lab["rank"]: v for lab, v in samples(text, "sentinel_optimizer_state_bytes", name)
            if lab.get("state") == "exp_avg"}
    params = {lab["rank"]: v for lab, v in samples(text, "sentinel_param_bytes", name)}
    world = max(prog.ranks, 1)
    assert sorted(held) == [str(r) for r in range(world)] and set(params.values()) == {params["0"]}, (held, params)
    assert sum(held.values()) == params["0"], (held, params)
    assert all(0 < v < params["0"] for v in held.values()) or world == 1, held


@pytest.mark.parametrize("pid", _programs())
def test_metrics_show_every_step_and_the_last_values(outcome: Any, pid: str) -> None:
    """Under ``sentinel run``: /metrics as the program exits shows one stream per
    optimizer (labelled ``optimizer="0"``, ``"1"`` in the order they first step when there
    are several), each at its own step count, with that optimizer's last loss and norm."""
    prog = BY_ID[pid]
    run = outcome(pid)["run"]
    assert run.snapshot is not None and run.ref is not None, _summary(run)
    text, name = run.snapshot["metrics"], f"zoo-{pid}"
    step = [(lab, v) for lab, v in samples(text, "sentinel_step", name) if lab.get("rank") == "0"]
    streams = max(prog.optimizers, 1)
    assert len(step) == streams, f"sentinel_step series of the run: {step} (want {streams})"
    bad = []
    for k in range(streams):
        index = prog.stepped[k] if prog.stepped else k  # the reference's: creation order
        ref = run.ref["optimizers"][index]
        want = {"rank": "0", **({"optimizer": str(k)} if prog.optimizers > 1 else {})}  # the reference is rank 0's

        def one(metric: str, ref: Any = ref, want: dict[str, str] = want) -> float | None:
            found = [v for lab, v in samples(text, metric, name) if all(lab.get(a) == b for a, b in want.items())]
            return found[0] if len(found) == 1 else None

        if one("sentinel_step") != len(ref):
            bad.append(f"optimizer {k}: sentinel_step {one('sentinel_step')}, the program made {len(ref)} steps")
        if index in prog.objective:  # a coefficient's loss: the scalar objective, and no sentinel_loss
            objective = [v for lab, v in samples(text, "sentinel_scalar", name)
                         if lab.get("name") == "objective" and all(lab.get(a) == b for a, b in want.items())]
            if len(objective) != 1 or not _close(objective[0], ref[-1]["loss"], 1e-5):
                bad.append(f"optimizer {k}: objective {objective}, last value {ref[-1]['loss']!r}")
            if one("sentinel_loss") is not None:
                bad.append(f"optimizer {k}: sentinel_loss {one('sentinel_loss')}, want none (a coefficient's)")
        elif not _close(one("sentinel_loss"), ref[-1]["loss"], 1e-5):
            bad.append(f"optimizer {k}: sentinel_loss {one('sentinel_loss')}, last loss {ref[-1]['loss']!r}")
        if not _close(one("sentinel_grad_norm"), ref[-1]["grad_norm"], prog.rel):
            bad.append(f"optimizer {k}: sentinel_grad_norm {one('sentinel_grad_norm')}, "
                       f"last norm {ref[-1]['grad_norm']!r}")
        if ref[-1]["preclip"] is not None and not _close(one("sentinel_grad_norm_preclip"), ref[-1]["preclip"],
                                                         prog.rel):
            bad.append(f"optimizer {k}: sentinel_grad_norm_preclip {one('sentinel_grad_norm_preclip')}, "
                       f"last pre-clip norm {ref[-1]['preclip']!r}")
    assert not bad, "; ".join(bad)


@pytest.mark.parametrize("pid", _programs(several=True))
def test_several_optimizers_are_as_many_streams_in_one_history_run(outcome: Any, pid: str) -> None:
    """Issue 18, point 2: the history holds one run (not one left ``running``) for all."""
    run = outcome(pid)["run"]
    assert run.history is not None, _summary(run)
    rows = run.history["runs"]
    assert len(rows) == 1, f"history rows: {[(r['run'], r['state'], r['steps']) for r in rows]}"
    assert (rows[0]["state"], rows[0]["exit_status"]) == ("finished", 0), rows[0]
    assert run.snapshot is not None
    text = run.snapshot["metrics"]
    labels = sorted(lab.get("optimizer", "") for lab, _ in samples(text, "sentinel_step", f"zoo-{pid}")
                    if lab.get("rank") == "0")
    assert labels == [str(k) for k in range(BY_ID[pid].optimizers)], f"sentinel_step's optimizer labels: {labels}"


@pytest.mark.parametrize("pid", [p.id for p in PROGRAMS if p.nan_at])
def test_a_nan_without_an_optimizer_fires_training_nonfinite(outcome: Any, pid: str) -> None:
    """Issue 18, point 4: weights updated by hand still get the NaN sentinel, at the
    backward() whose loss was NaN."""
    prog, run = BY_ID[pid], outcome(pid)["run"]
    assert run.history is not None, _summary(run)
    fired = [a for a in run.history["alerts"] if a["alertname"] == "TrainingNonFinite" and a["state_to"] == "firing"]
    assert fired, f"no TrainingNonFinite; alerts: {[(a['alertname'], a['state_to']) for a in run.history['alerts']]}"
    assert fired[0]["step"] == prog.nan_at, fired[0]


@pytest.mark.parametrize("mode", MODES)
def test_dp_sgd_clipped_per_sample_is_not_told_to_clip(outcome: Any, mode: str) -> None:
    """Opacus's ``DPOptimizer`` clips each sample's gradient to ``max_grad_norm`` (1.0) in its
    ``step()``, then steps the SGD it wraps: the SGD's record carries that bound (on
    /metrics as the clip the advice reads), and ``SGDWithoutClipping`` stays silent (it
    fired, info, at step 100 of both modes before the wrapper was known)."""
    run = outcome("dp_sgd")[mode]
    assert run.history is not None, _summary(run)
    advice = [a for a in run.history["alerts"] if a["alertname"] == "SGDWithoutClipping"]
    assert not advice, f"{mode}: {advice}"
    if mode == "run":  # (the watch mode's monitor is closed before the exit's snapshot)
        assert run.snapshot is not None, _summary(run)
        clip = [v for _, v in samples(run.snapshot["metrics"], "sentinel_optimizer_sgd_clip_max_norm", "zoo-dp_sgd")]
        assert clip == [1.0], f"sentinel_optimizer_sgd_clip_max_norm {clip}"
