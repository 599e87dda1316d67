"""``sentinel demo``: train TinyGPT on the CPU, inject a fault, show what sentinel sees."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

import sentinel
from sentinel.demo.model import TinyGPT, loss_fn, synthetic_batch

FAULTS = ("none", "nan", "spike", "lr-high", "lr-low", "oscillate", "leak", "hang")


@dataclass
class DemoConfig:
    fault: str = "none"
    steps: int = 400
    fault_step: int = 0
    """Step at which the fault starts; 0 means at 40% of the run."""
    listen: str = "127.0.0.1:9400"
    delay: float = 0.04
    """Seconds of sleep per step, so the live view is watchable."""
    seed: int = 0
    hang_seconds: float = 20.0
    config: str | None = None
    run: str = ""
    extra_watch: dict[str, Any] = field(default_factory=dict)


class _Fault:
    """Applies one fault to the loop. Each hook returns quickly when not active."""

    def __init__(self, cfg: DemoConfig, model: TinyGPT, opt: torch.optim.Optimizer) -> None:
        self.cfg, self.model, self.opt = cfg, model, opt
        self.start = cfg.fault_step or max(1, int(cfg.steps * 0.4))
        self.leak: list[torch.Tensor] = []
        self.base_lr = [g["lr"] for g in opt.param_groups]

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
            p = next(self.model.layers[1].mlp.parameters())
            assert p.grad is not None
            p.grad.view(-1)[0] = float("nan")

    def before_step(self, step: int) -> None:
        f = self.cfg.fault
        if f in ("lr-high", "lr-low") and step == self.start:
            factor = 50.0 if f == "lr-high" else 1e-6
            for g, lr in zip(self.opt.param_groups, self.base_lr):
                g["lr"] = lr * factor
        if f == "leak" and self.active(step):
            self.leak.append(torch.ones(4 * 2**20 // 4))  # 4 MiB a step, never freed

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
    mon = sentinel.watch(model, opt, **watch_opts)
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
        console.print()
    return {"alerts": sorted(seen), "steps": cfg.steps, "errors": mon.errors}
