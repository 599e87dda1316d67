"""``sentinel demo``: train TinyGPT on the CPU, inject a fault, show what sentinel sees."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

import sentinel
from sentinel.demo.model import TinyGPT, loss_fn, synthetic_batch
from sentinel.instrument import probes

FAULTS = ("none", "nan", "spike", "lr-high", "lr-low", "oscillate", "leak", "hang")

EXPECTED_ALERTS: dict[str, tuple[str, ...]] = {
    "none": (),
    "nan": ("TrainingNonFinite",),
    "spike": ("GradientSpike", "LossSpike"),
    "lr-high": ("UpdateRatioHigh", "LossDivergence", "LossOscillation", "LossSpike"),
    "lr-low": ("UpdateRatioLow",),
    "oscillate": ("LossOscillation",),
    "leak": ("OOMRisk",),
    "hang": ("TrainingStalled",),
}
"""The alerts that match each fault: the demo shows at least one of them (none for ``none``)."""


@dataclass
class DemoConfig:
    """What the demo runs.

    Attributes:
        fault: one of :data:`FAULTS`.
        steps: training steps.
        fault_step: step at which the fault starts; 0 means at 40 % of the run.
        listen: HTTP address of the metrics endpoint.
        delay: seconds of sleep per step, so the live view is watchable.
        seed: seeds the model and the data.
        hang_seconds: how long the ``hang`` fault blocks the loop. The stall rule's
            threshold is lowered to a quarter of it (at least 1 s) for the demo, since
            its default (10 minutes) suits real jobs, not a one-minute demo.
        config: a sentinel config file (rules, notifications).
        run: the run label (default ``demo-<fault>``).
        extra_watch: more ``sentinel.watch`` options.
        leak_mib: MiB the ``leak`` fault keeps per step.
        leak_headroom_mib: for ``leak``, the memory capacity the OOM rule compares with
            is the process's RSS at start plus this (unless ``extra_watch`` sets
            ``memory_capacity_bytes``): the host's real limit is far away on most machines.
    """

    fault: str = "none"
    steps: int = 400
    fault_step: int = 0
    listen: str = "127.0.0.1:9400"
    delay: float = 0.04
    seed: int = 0
    hang_seconds: float = 20.0
    config: str | None = None
    run: str = ""
    extra_watch: dict[str, Any] = field(default_factory=dict)
    leak_mib: float = 4.0
    leak_headroom_mib: float = 384.0


class _Fault:
    """Applies one fault to the loop. Each hook returns quickly when not active."""

    def __init__(self, cfg: DemoConfig, model: TinyGPT, opt: torch.optim.Optimizer) -> None:
        self.cfg, self.model, self.opt = cfg, model, opt
        self.start = cfg.fault_step or max(1, int(cfg.steps * 0.4))
        self.leak: list[torch.Tensor] = []
        self.base_lr = [g["lr"] for g in opt.param_groups]
        self._config_file: str | None = None

    def watch_options(self) -> dict[str, Any]:
        """``sentinel.watch`` options the fault needs to be seen within a demo's length.

        Always a config file: the user's, if any, with ``notify.console: false`` (the live
        view draws the alerts; lines from the engine on the same terminal would garble it).
        ``leak``: a memory capacity near the current RSS. ``hang``: the stall rule's
        threshold within ``hang_seconds``. Call :meth:`close` afterwards to remove the file.
        """
        cfg = self.cfg
        out: dict[str, Any] = {}
        if cfg.fault == "leak" and "memory_capacity_bytes" not in cfg.extra_watch:
            rss = probes.host_memory().get("host_rss", 0.0)
            out["memory_capacity_bytes"] = int(rss + cfg.leak_headroom_mib * 2**20)
        doc: dict[str, Any] = {}
        user = cfg.config or cfg.extra_watch.get("config")
        if user:
            with open(user, encoding="utf-8") as f:
                doc = yaml.safe_load(f) or {}
        doc.setdefault("notify", {})["console"] = False
        if cfg.fault == "hang":
            stall = doc.setdefault("rules", {}).setdefault("TrainingStalled", {})
            params = stall.setdefault("params", {})
            params.setdefault("min_seconds", max(1.0, cfg.hang_seconds / 4))
            params.setdefault("factor", 5.0)
        fd, self._config_file = tempfile.mkstemp(prefix="sentinel-demo-", suffix=".yaml")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(doc, f)
        out["config"] = self._config_file
        return out

    def close(self) -> None:
        """Free the leak and remove the config file :meth:`watch_options` wrote."""
        self.leak.clear()
        if self._config_file is not None:
            os.unlink(self._config_file)
            self._config_file = None

    def active(self, step: int) -> bool:
        return self.cfg.fault != "none" and step >= self.start

    def batch(self, step: int, gen: torch.Generator, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = synthetic_batch(gen, batch, seq, 256)
        if self.cfg.fault == "oscillate" and self.active(step) and (step // 4) % 2:
            # an unshuffled data loader: blocks of steps from a different distribution
            y = (y * 7 + 3) % 256
        return x, y

    def scale_loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        if self.cfg.fault == "spike" and step == self.start:
            return loss * 200.0  # one corrupt batch
        return loss

    def after_backward(self, step: int) -> None:
        if self.cfg.fault == "nan" and step == self.start:
            # one element of layers.1's MLP gradient: the alert names group layers.1
            grad = self.model.get_parameter("layers.1.mlp.0.weight").grad
            assert grad is not None
            grad.view(-1)[0] = float("nan")

    def before_step(self, step: int) -> None:
        f = self.cfg.fault
        if f in ("lr-high", "lr-low") and step == self.start:
            factor = 50.0 if f == "lr-high" else 1e-6
            for g, lr in zip(self.opt.param_groups, self.base_lr):
                g["lr"] = lr * factor
        if f == "leak" and self.active(step):
            self.leak.append(torch.ones(int(self.cfg.leak_mib * 2**20) // 4))  # never freed

    def hang(self, step: int) -> None:
        if self.cfg.fault == "hang" and step == self.start:
            time.sleep(self.cfg.hang_seconds)


def _fmt(v: float | None, spec: str = ".4g") -> str:
    return "—" if v is None else format(v, spec)


def _view(mon: sentinel.Monitor, cfg: DemoConfig, step: int, t0: float) -> Group:
    store = mon.engine.engine.store if mon.engine is not None else None

    def last(name: str) -> float | None:
        if store is None:
            return None
        for labels in store.labelsets(name):
            row = store.last(name, labels)
            if row is not None:
                return row[2]
        return None

    table = Table(title=f"sentinel demo — fault: {cfg.fault}", title_justify="left")
    for col in ("step", "loss", "grad norm", "update ratio", "memory (RSS)", "steps/s"):
        table.add_column(col, justify="right")
    mem = last("sentinel_host_memory_rss_bytes")
    elapsed = max(time.monotonic() - t0, 1e-9)
    table.add_row(f"{step}/{cfg.steps}", _fmt(last("sentinel_loss")), _fmt(last("sentinel_grad_norm")),
                  _fmt(last("sentinel_update_ratio"), ".2e"),
                  "—" if mem is None else f"{mem / 2**20:.0f} MiB", f"{step / elapsed:.1f}")
    parts: list[Any] = [table]
    alerts = _alerts(mon)
    if alerts:
        at = Table(title="alerts", title_justify="left")
        for col in ("state", "severity", "alert", "summary"):
            at.add_column(col)
        for a in alerts:
            at.add_row(a["state"], a["severity"], a["alertname"], a["summary"])
        parts.append(at)
    else:
        parts.append(Text("no alerts", style="green"))
    parts.append(Text(f"metrics: {mon.url}/metrics" if mon.url else "metrics: engine off", style="dim"))
    return Group(*parts)


def _alerts(mon: sentinel.Monitor) -> list[dict[str, Any]]:
    engine = getattr(mon.engine, "engine", None)
    getter: Callable[[], list[dict[str, Any]]] | None = getattr(engine, "alerts_json", None)
    return getter() if getter is not None else []


def run_demo(cfg: DemoConfig, console: Console | None = None) -> dict[str, Any]:
    """Train, inject the fault, show the live view. Returns a summary (alerts seen)."""
    console = console or Console()
    torch.manual_seed(cfg.seed)
    model = TinyGPT(dim=64, depth=2, seq=32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    fault = _Fault(cfg, model, opt)
    gen = torch.Generator().manual_seed(cfg.seed)
    # thread mode: the live view reads the engine's store directly
    watch_opts: dict[str, Any] = {"listen": cfg.listen, "run": cfg.run or f"demo-{cfg.fault}",
                                  "job": "demo", "engine": "thread", **cfg.extra_watch}
    if cfg.config:
        watch_opts["config"] = cfg.config
    watch_opts.update(fault.watch_options())
    try:
        mon = sentinel.watch(model, opt, **watch_opts)
    except BaseException:
        fault.close()
        raise
    t0 = time.monotonic()
    seen: dict[str, dict[str, Any]] = {}
    state = {"step": 0}
    try:
        # the view is rebuilt at every refresh, so it stays live while the loop hangs
        with Live(get_renderable=lambda: _view(mon, cfg, state["step"], t0), console=console,
                  refresh_per_second=4, transient=False):
            for step in range(1, cfg.steps + 1):
                fault.hang(step)
                x, y = fault.batch(step, gen, 16, 32)
                loss = fault.scale_loss(step, loss_fn(model(x), y))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                fault.after_backward(step)
                fault.before_step(step)
                opt.step()
                mon.log(loss=loss)
                state["step"] = step
                for a in _alerts(mon):
                    seen.setdefault(a["alertname"], a)
                if cfg.delay:
                    time.sleep(cfg.delay)
            if mon.engine is not None:
                mon.engine.flush()
            for a in _alerts(mon):
                seen.setdefault(a["alertname"], a)
    finally:
        mon.close()
        fault.close()
        console.print()
    return {"alerts": sorted(seen), "steps": cfg.steps, "errors": mon.errors}
