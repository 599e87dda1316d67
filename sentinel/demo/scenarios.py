"""Detection scenarios: real CPU training runs with one injected fault each, judged by the
built-in rule pack.

Each :class:`Scenario` trains a small real model (:mod:`sentinel.demo.tasks`) for a few
hundred steps under a :class:`~sentinel.instrument.monitor.Monitor` whose sender feeds an
:class:`~sentinel.engine.engine.Engine` in the training thread (:class:`EngineSender`), so
every frame is ingested and judged before the next step starts. A fault starts at a known
step; :func:`run_scenario` returns which alerts fired, when, and the detection delay.
Clean scenarios inject nothing: no warning or critical alert may fire on them.

The hang scenario is time-based: the engine gets a :class:`ManualClock`, the loop stops at
the fault step, and the clock is advanced (no sleeping) until the stall rule fires. Used by
``tests/scenarios`` (assertions) and ``benchmarks/detection.py`` (a table).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch

from sentinel.demo.tasks import (
    DEFAULT_LR,
    MODELS,
    MORE_OPTIMIZERS,
    OPTIMIZERS,
    ModelName,
    OptimizerName,
    Task,
    backward_and_step,
    make_optimizer,
)
from sentinel.engine.engine import Engine
from sentinel.instrument import probes
from sentinel.instrument.monitor import Monitor
from sentinel.instrument.options import from_kwargs
from sentinel.rules.config import RulePack, load_pack

FaultKind = Literal[
    "none", "nan-loss", "nan-grad", "corrupt-batch", "lr-high", "lr-low", "plateau",
    "unshuffled", "leak", "hang", "amp-overflow", "amp-collapse", "bad-batch",
]  # fmt: skip
STALL = "TrainingStalled"


class EngineSender:
    """A sender that ingests every frame into an in-process :class:`Engine`, synchronously.

    It never drops: :meth:`send` returns what :meth:`Engine.feed` returns (False only for
    a malformed frame). Rules are evaluated in the caller's thread before it returns, so a
    test or benchmark sees every alert of a step right after the step.

    Args:
        engine: the engine to feed (a fresh one with the default pack by default).
    """

    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine if engine is not None else Engine()
        self.dropped = 0
        self.sent = 0

    def send(self, data: bytes) -> bool:
        """Ingest one encoded frame; False if the engine rejected it."""
        ok = self.engine.feed(data)
        self.sent += 1
        self.dropped += not ok
        return ok

    def close(self) -> None:
        """Nothing to release."""


class ManualClock:
    """Wall-clock time plus an offset that only :meth:`advance` changes: a hang of an hour
    takes no real time."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.offset += seconds


@dataclass(frozen=True)
class Scenario:
    """One training run and what the rule pack must make of it.

    Attributes:
        name: short id (also the run label).
        fault: what goes wrong; ``none`` for a clean run.
        fault_step: the training iteration the fault starts at (it lasts to the end for
            persistent faults: lr changes, leaks, broken data, repeated overflows).
        expect: alert names any one of which must fire (empty: none is expected).
        max_delay: the largest acceptable detection delay in steps, first firing step of
            an expected alert minus the fault's step; derived from the rule's window.
        quiet: no alert of any severity may fire (not even info).
        expect_groups: groups the first firing of the expected alert must name.
        lr_factor: the learning rate is multiplied by this at ``fault_step`` (lr faults).
        amp: train with ``torch.amp.GradScaler("cpu")`` passed to the monitor.
        watch: extra ``sentinel.watch`` options.
        rules: rule overrides, as in a config's ``rules:`` section.
        leak_mib: for ``leak``: MiB leaked per step; the memory capacity is set so that
            the OOM rule's ratio is reached after ``leak_budget_mib`` more MiB (0: no
            capacity is set; the limit is the process's cgroup's or the machine's).
        label_noise: the fraction of targets replaced at random (the task's).
        bad_fraction: for ``bad-batch``: the fraction of the batch's rows that are noise.
        schedule: ``cosine``: torch's ``CosineAnnealingLR`` from the task's lr to 0 over
            the run, stepped every iteration; ``warmup-cosine``: a ``LinearLR`` warmup from
            1/1000 of it over the first fifth, then the cosine (a ``SequentialLR``);
            ``step``: ``StepLR``, the lr ×0.1 at each third of the run.
        lr_scale: the task's learning rate is multiplied by this from the start.
        why: one line on what the scenario shows.
    """

    name: str
    model: ModelName = "mlp"
    optimizer: OptimizerName = "adamw"
    steps: int = 300
    fault: FaultKind = "none"
    fault_step: int = 0
    expect: tuple[str, ...] = ()
    max_delay: int = 0
    quiet: bool = False
    expect_groups: tuple[str, ...] = ()
    lr_factor: float = 1.0
    amp: bool = False
    batch: int = 16
    seed: int = 0
    watch: Mapping[str, Any] = field(default_factory=dict)
    rules: Mapping[str, Any] = field(default_factory=dict)
    leak_mib: float = 1.0
    leak_budget_mib: float = 48.0
    label_noise: float = 0.0
    bad_fraction: float = 0.25
    schedule: Literal["none", "cosine", "warmup-cosine", "step"] = "none"
    lr_scale: float = 1.0
    why: str = ""

    @property
    def clean(self) -> bool:
        """No fault is injected."""
        return self.fault == "none"

    @property
    def pack(self) -> RulePack:
        """The built-in pack with this scenario's overrides."""
        return load_pack({"rules": dict(self.rules)})


@dataclass
class Firing:
    """The first firing of one alert in a run."""

    alertname: str
    severity: str
    step: int
    groups: tuple[str, ...]
    summary: str


@dataclass
class ScenarioResult:
    """What happened in one scenario run.

    Attributes:
        fault_step: the monitor step the fault was injected at (None for clean runs).
        firings: the first firing of each alert, in firing order.
        steps: optimizer steps completed.
        seconds: wall time of the run.
        stall_seconds: for the hang, the (simulated) silence when the stall rule fired.
    """

    scenario: Scenario
    fault_step: int | None
    firings: list[Firing]
    steps: int
    seconds: float
    stall_seconds: float | None = None

    @property
    def fired(self) -> list[str]:
        """Alert names that fired, in order of their first firing."""
        return [f.alertname for f in self.firings]

    @property
    def detected(self) -> Firing | None:
        """The earliest firing of an expected alert, or None."""
        hits = [f for f in self.firings if f.alertname in self.scenario.expect]
        return min(hits, key=lambda f: f.step) if hits else None

    @property
    def delay(self) -> int | None:
        """Detection delay in steps: first firing step of an expected alert − fault step."""
        d = self.detected
        return None if d is None or self.fault_step is None else d.step - self.fault_step

    @property
    def false_alerts(self) -> list[Firing]:
        """Warning/critical firings a clean run must not have, any firing of a quiet run,
        and warning/critical firings before the fault of a faulty run."""
        sc = self.scenario
        if sc.quiet:
            return list(self.firings)
        serious = [f for f in self.firings if f.severity != "info"]
        if sc.clean:
            return serious
        return [f for f in serious if self.fault_step is not None and f.step < self.fault_step]

    @property
    def info_alerts(self) -> list[Firing]:
        """Info firings (tolerated on clean runs, but reported)."""
        return [f for f in self.firings if f.severity == "info"]

    def problems(self) -> list[str]:
        """Why this run fails its scenario; empty when it passes."""
        sc, out = self.scenario, []
        out += [f"false alert {f.alertname} ({f.severity}) at step {f.step}: {f.summary}"
                for f in self.false_alerts]
        if sc.expect:
            d = self.detected
            if d is None:
                out.append(f"none of {', '.join(sc.expect)} fired (fired: {self.fired or 'none'})")
            else:
                delay = self.delay
                if delay is not None and not 0 <= delay <= sc.max_delay:
                    out.append(f"{d.alertname} fired {delay} steps after the fault "
                               f"(target 0..{sc.max_delay})")
                missing = [g for g in sc.expect_groups if g not in d.groups]
                if missing:
                    out.append(f"{d.alertname} names groups {list(d.groups)}, not {missing}")
        return out


class _Injector:
    """Applies a scenario's fault to the loop; every hook is a no-op when inactive."""

    def __init__(self, sc: Scenario, task: Task, opt: torch.optim.Optimizer) -> None:
        self.sc, self.task, self.opt = sc, task, opt
        self.leak: list[torch.Tensor] = []
        self.base_lr = [g["lr"] for g in opt.param_groups]

    def on(self, it: int) -> bool:
        return not self.sc.clean and it >= self.sc.fault_step

    def at(self, it: int) -> bool:
        return not self.sc.clean and it == self.sc.fault_step

    def only_class(self, it: int) -> int | None:
        """Unshuffled data sorted by label: every batch of a block of 8 steps is one class."""
        return (it // 8) % 4 if self.sc.fault == "unshuffled" and self.on(it) else None

    def batch(self, it: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.sc.fault
        if f == "corrupt-batch" and self.at(it):
            return self.task.corrupt(x, y)
        if f == "plateau" and self.on(it):
            return self.task.unlearnable(x, y)
        if f == "bad-batch" and self.at(it):
            return self.task.garbage(x, y, self.sc.bad_fraction)
        return x, y

    def loss(self, it: int, loss: torch.Tensor) -> torch.Tensor:
        if self.sc.fault == "nan-loss" and self.at(it):
            return loss * float("nan")  # e.g. log(0) in the loss
        return loss

    def after_backward(self, it: int) -> None:
        f = self.sc.fault
        if f == "nan-grad" and self.at(it):
            self._first_grad(self.sc.expect_groups[0]).view(-1)[0] = float("nan")
        elif (f == "amp-overflow" and self.at(it)) or (f == "amp-collapse" and self.on(it)):
            self._first_grad("").view(-1)[0] = float("inf")  # an fp16 overflow
        if f in ("lr-high", "lr-low") and self.at(it):
            for g, lr in zip(self.opt.param_groups, self.base_lr):
                g["lr"] = lr * self.sc.lr_factor
        if f == "leak" and self.on(it):
            # never freed, like a loss history kept with its graph
            self.leak.append(torch.ones(int(self.sc.leak_mib * 2**20) // 4))

    def _first_grad(self, prefix: str) -> torch.Tensor:
        for name, p in self.task.model.named_parameters():
            if p.grad is not None and name.startswith(prefix):
                return p.grad
        raise ValueError(f"no parameter with a gradient under {prefix!r}")


def _capacity(sc: Scenario, pack: RulePack) -> int:
    """A memory capacity the OOM rule reaches after ``leak_budget_mib`` more MiB of RSS."""
    rss = probes.host_memory().get("host_rss", 0.0)
    ratio = float(getattr(pack.get("OOMRisk").params, "ratio", 0.9))
    return int((rss + sc.leak_budget_mib * 2**20) / ratio)


def run_scenario(sc: Scenario, *, max_stall_seconds: float = 7200.0) -> ScenarioResult:
    """Train the scenario's model with its fault and collect the alerts the engine fired.

    Args:
        sc: the scenario.
        max_stall_seconds: for ``hang``, how far the clock may be advanced before giving up.

    Returns:
        The result; see :meth:`ScenarioResult.problems` for the verdict.
    """
    t0 = time.perf_counter()
    pack = sc.pack
    clock = ManualClock()
    engine = Engine(pack=pack, clock=clock)
    task = Task(sc.model, seed=sc.seed, batch=sc.batch, label_noise=sc.label_noise)
    opt = make_optimizer(sc.optimizer, task.model.parameters(), DEFAULT_LR[(sc.model, sc.optimizer)] * sc.lr_scale)
    sched = _schedule(sc, opt)
    scaler = torch.amp.GradScaler("cpu") if sc.amp else None
    watch: dict[str, Any] = {"engine": "off", "job": "scenarios", "run": sc.name, **sc.watch}
    if sc.fault == "leak" and sc.leak_budget_mib > 0:
        watch.setdefault("memory_capacity_bytes", _capacity(sc, pack))
    mon = Monitor(task.model, [opt], from_kwargs(watch), sender=EngineSender(engine), scaler=scaler)
    inject = _Injector(sc, task, opt)
    fault_step: int | None = None
    stall_seconds: float | None = None
    try:
        for it in range(1, sc.steps + 1):
            x, y = inject.batch(it, *task.batch(inject.only_class(it)))
            loss = inject.loss(it, task.loss(task.model(x), y))
            opt.zero_grad(set_to_none=True)
            backward_and_step(loss, opt, scaler, after_backward=partial(inject.after_backward, it))
            mon.log(loss=loss)
            if sched is not None:
                sched.step()
            if inject.at(it):
                # the step its frames report: a step the GradScaler skipped reports the last
                # completed step again
                fault_step = mon.steps
            if sc.fault == "hang" and inject.at(it):
                stall_seconds = _hang(engine, clock, max_stall_seconds)
                break  # the loop never comes back
    finally:
        mon.close()
        inject.leak.clear()
        _trim()
    firings: dict[str, Firing] = {}
    for t in engine.transitions:
        if t.state_to == "firing" and t.alertname not in firings:
            firings[t.alertname] = Firing(t.alertname, t.severity, t.step, t.groups, t.summary)
    return ScenarioResult(sc, fault_step, list(firings.values()), mon.steps,
                          time.perf_counter() - t0, stall_seconds)


def _trim() -> None:
    """Give the leaked memory back to the OS (glibc's ``malloc_trim``): freed heap pages
    stay resident otherwise, and the next leak scenario in this process would reuse them
    without its RSS growing."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _schedule(sc: Scenario, opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The scenario's learning-rate schedule, stepped once per iteration."""
    sched = torch.optim.lr_scheduler
    if sc.schedule == "step":
        return sched.StepLR(opt, step_size=max(1, sc.steps // 3), gamma=0.1)
    if sc.schedule == "cosine":
        return sched.CosineAnnealingLR(opt, T_max=sc.steps, eta_min=0.0)
    if sc.schedule == "warmup-cosine":
        warm = sc.steps // 5
        return sched.SequentialLR(opt, [sched.LinearLR(opt, start_factor=1e-3, total_iters=warm),
                                        sched.CosineAnnealingLR(opt, T_max=sc.steps - warm, eta_min=0.0)],
                                  milestones=[warm])
    return None


def _hang(engine: Engine, clock: ManualClock, limit: float, tick: float = 5.0) -> float | None:
    """Advance the clock in ``tick`` steps, ticking the engine, until the stall rule fires.

    Returns:
        The silence (seconds since the hang began) at which it fired, or None.
    """
    start = clock()
    while clock() - start < limit:
        clock.advance(tick)
        if any(t.alertname == STALL and t.state_to == "firing" for t in engine.tick()):
            return clock() - start
    return None


def _clean(model: ModelName, optimizer: OptimizerName) -> Scenario:
    return Scenario(f"clean-{model}-{optimizer}", model, optimizer, steps=400,
                    why=f"{model} trained with {optimizer}: no warning or critical alert")


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("nan-loss", "mlp", "adamw", fault="nan-loss", fault_step=120,
             expect=("TrainingNonFinite",), max_delay=1, steps=140,
             why="NaN loss at one step (log of zero)"),
    Scenario("nan-grad-layer", "mlp", "sgd", fault="nan-grad", fault_step=120,
             expect=("TrainingNonFinite",), max_delay=1, expect_groups=("layers.1",), steps=140,
             why="NaN in one element of layers.1's gradient; the alert names layers.1"),
    Scenario("corrupt-batch", "mlp", "adamw", fault="corrupt-batch", fault_step=150,
             expect=("GradientSpike",), max_delay=1, steps=200,
             why="one batch with inputs ×100: a gradient spike"),
    Scenario("lr-high", "mlp", "adamw", fault="lr-high", fault_step=120, lr_factor=100.0,
             expect=("UpdateRatioHigh", "LossDivergence", "LossOscillation"), max_delay=30,
             steps=260, why="learning rate ×100 mid-run"),
    Scenario("lr-low", "mlp", "adamw", fault="lr-low", fault_step=100, lr_factor=1e-4,
             expect=("UpdateRatioLow",), max_delay=210, steps=330,
             why="learning rate ×1e-4 mid-run: 100 steps of lr grace, then 2 low samples (every 100 steps)"),
    Scenario("plateau", "mlp", "adamw", fault="plateau", fault_step=1,
             expect=("LossPlateau",), max_delay=800, steps=820,
             why="labels independent of the inputs from the start: the loss cannot improve"),
    Scenario("unshuffled", "cnn", "adamw", fault="unshuffled", fault_step=150,
             expect=("LossOscillation",), max_delay=100, steps=300,
             why="data sorted by label from step 150: blocks of 8 single-class batches"),
    Scenario("leak", "mlp", "adamw", fault="leak", fault_step=60, leak_mib=1.0,
             expect=("OOMRisk",), max_delay=100, steps=200,
             why="1 MiB of tensors kept every step towards a capacity 48 MiB above 90 %"),
    Scenario("hang", "mlp", "adamw", fault="hang", fault_step=150,
             expect=(STALL,), max_delay=0, steps=200,
             why="the loop stops at step 150; the clock runs on (simulated, no sleep)"),
    Scenario("amp-overflow", "mlp", "adamw", fault="amp-overflow", fault_step=150, amp=True,
             quiet=True, steps=300,
             why="one fp16-style overflow: GradScaler skips a step and halves its scale"),
    Scenario("amp-collapse", "mlp", "adamw", fault="amp-collapse", fault_step=150, amp=True,
             expect=("LossScaleCollapse",), max_delay=5, steps=180,
             why="inf gradients at every step from 150: every step skipped, scale halving"),
    Scenario("amp-collapse-early", "mlp", "adamw", fault="amp-collapse", fault_step=20,
             amp=True, expect=("LossScaleCollapse",), max_delay=5, steps=80,
             why="every step overflows from step 20, before any warm-up: the scale sinks below 1"),
    Scenario("corrupt-batch-gvr", "mlp", "adamw", fault="corrupt-batch", fault_step=250,
             expect=("GradientNoiseRising",), max_delay=1, steps=270,
             why="one batch with inputs ×100 after GVR's warm-up: its variance ratio jumps (seed 000 §4.4)"),
    Scenario("lr-high-start", "mlp", "adamw", fault="lr-high", fault_step=1, lr_factor=100.0,
             expect=("EarlyUpdateTooLarge", "UpdateRatioHigh"), max_delay=10,
             steps=120, why="learning rate ×100 from step 1: the loss swings, then settles (no NaN)"),
    Scenario("lr-low-start", "cnn", "adamw", fault="lr-low", fault_step=1, lr_factor=1e-3,
             expect=("EarlyLossStalled", "UpdateRatioLow"), max_delay=60, steps=120,
             why="learning rate ×1e-3 from step 1: the loss has not fallen by step 50"),
    Scenario("cosine-adamw", "mlp", "adamw", steps=400, schedule="cosine", watch={"update_every": 2},
             why="cosine schedule to zero: the last updates are tiny by the schedule's doing"),
    Scenario("cosine-sgd", "mlp", "sgd", steps=400, schedule="cosine", watch={"update_every": 2},
             why="SGD with momentum, cosine schedule to zero"),
    Scenario("warmup-cosine-adamw", "gpt", "adamw", steps=400, schedule="warmup-cosine",
             watch={"update_every": 2}, why="warmup from 1/1000 of the lr, then cosine to zero"),
    Scenario("lr-low-cosine", "mlp", "adamw", fault="lr-low", fault_step=1, lr_scale=1e-4,
             schedule="cosine", expect=("UpdateRatioLow",), max_delay=60, steps=200,
             why="the optimizer built with 1e-4 of the working lr, under a cosine schedule: still too low"),
    # faults from step 1 are due within 10 steps: seed 004 §4.2's 10-step divergence check
    # the seeds' six optimizers, each with its typical fault where one exists (seed 000 §2,
    # seed 004 §3.2-3.3): SGD without clipping at a too high lr, LAMB's sensitivity to its
    # global lr, Lion run at an Adam-sized lr (it needs 3-10× less)
    Scenario("sgd-lr-high-start", "mlp", "sgd", fault="lr-high", fault_step=1, lr_factor=30.0,
             expect=("EarlyUpdateTooLarge", "UpdateRatioHigh", "TrainingNonFinite"), max_delay=10, steps=120,
             why="SGD with momentum at 30× its lr from step 1, no clipping: it blows up within 20 steps"),
    Scenario("lamb-lr-high-start", "mlp", "lamb", fault="lr-high", fault_step=1, lr_factor=30.0,
             expect=("EarlyUpdateTooLarge", "UpdateRatioHigh"), max_delay=10, steps=120,
             why="LAMB at 30× its lr from step 1: its trust-scaled updates exceed 10 % of the weights"),
    Scenario("lion-adam-lr", "mlp", "lion", fault="lr-high", fault_step=1, lr_factor=100.0,
             expect=("EarlyUpdateTooLarge", "UpdateRatioHigh"), max_delay=10, steps=120,
             why="Lion at 10× Adam's lr (100× its own) from step 1: every sign step is too large"),
    # faults that are large only relative to the run (issue 20): judged against its own
    # noise, its memory trend and the first loss it reported
    Scenario("lm-bad-batch", "gpt", "adamw", fault="bad-batch", fault_step=450, bad_fraction=0.25,
             label_noise=0.2, batch=32, schedule="warmup-cosine", expect=("LossSpike",), max_delay=3,
             steps=480, why="a quarter of one batch random tokens with shuffled targets: the loss 1.67× its median"),
    Scenario("lm-lr-blowup", "gpt", "adamw", fault="lr-high", fault_step=200, lr_factor=20.0,
             label_noise=0.2, expect=("LossRising", "UpdateRatioHigh"), max_delay=12,
             steps=400, why="a schedule bug: the lr ×20 at step 200 of 400; the loss climbs 1.5× over a dozen steps"),
    Scenario("lm-blowup-start", "gpt", "adamw", fault="lr-high", fault_step=1, lr_factor=1000.0,
             expect=("EarlyLossExplosion",), max_delay=10, steps=60,
             why="lr 3.0 from step 1: the loss is thrown far above the first loss at once"),
    Scenario("leak-no-limit", "mlp", "adamw", fault="leak", fault_step=40, leak_mib=10.0,
             leak_budget_mib=0.0, expect=("OOMRisk", "MemoryCritical"), max_delay=200, steps=250,
             why="10 MiB kept every step, no container limit: the machine's memory is the limit "
                 "(a forecast waits for a rise of 1/20 of the headroom: 1.2 GiB here)"),
    Scenario("leak-loose-limit", "mlp", "adamw", fault="leak", fault_step=40, leak_mib=6.0,
             leak_budget_mib=0.0, watch={"memory_capacity_bytes": 4 * 2**30}, expect=("OOMRisk", "MemoryCritical"),
             max_delay=120, steps=170, why="6 MiB a step under a 4 GiB limit, far below half of it "
                                           "(a trend needs 12 memory samples: 120 steps)"),
    *(_clean(m, o) for m in MODELS for o in OPTIMIZERS),
    # long clean runs of kinds the matrix does not hold (1,200 steps each)
    Scenario("clean-lm-long", "gpt", "adamw", steps=1200, label_noise=0.2, schedule="warmup-cosine",
             why="a transformer LM with warmup and cosine decay, 20 % noisy targets"),
    Scenario("clean-noisy-labels-long", "cnn", "sgd", steps=1200, label_noise=0.3, batch=8,
             why="a CNN on 30 % random labels at batch 8: a noisy small-batch loss"),
    Scenario("clean-regression-step-long", "mlp", "sgd", steps=1200, schedule="step",
             why="SGD regression with a step schedule (lr ×0.1 at steps 400 and 800)"),
    *(Scenario(f"clean-mlp-{o}", "mlp", o, steps=300, why=f"mlp trained with {o}: no warning or critical alert")
      for o in MORE_OPTIMIZERS),
)
"""Every scenario, fault ones first, then a clean run of each model with each optimizer."""


def scenario(name: str) -> Scenario:
    """The scenario called ``name``.

    Raises:
        KeyError: no such scenario.
    """
    return {sc.name: sc for sc in SCENARIOS}[name]
