"""Seed 004's optimizer instance test, on a small CPU model, recorded by sentinel.

The procedure (seed 004 §2–4): one fixed model, data split, step budget and weight decay
(0.01), the optimizer the only variable.

1. A 10-step warm-up per optimizer at a middle learning rate: one whose held-out loss
   goes non-finite or above 1.5 × where it started is marked diverged and left out.
2. A short learning-rate sweep (1e-4, 3e-4, 1e-3, 3e-3, scaled per optimizer to its usual
   range) at seed 0; the lr kept is the one with the lowest held-out loss among the sweep
   runs whose held-out loss went down.
3. Three seeds at that lr for the full budget, every run under ``sentinel.watch`` with
   tags ``optimizer``, ``lr``, ``seed`` and ``phase``.
4. ``sentinel compare`` over the main runs: the seeds aggregate as mean ± std.

Optimizers: SGD with momentum (clip 1.0), AdamW, Adafactor (``torch.optim``), LAMB, Lion and
Sophia (SophiaH, from ``pytorch-optimizer``; a Hutchinson Hessian estimate, so its
backward keeps the graph); adaptive ones clip at 5.0 (seed 004 §3.2).

    python examples/optimizer_shootout.py            # about half a minute on 2 busy shared cores
    python examples/optimizer_shootout.py --quick    # a few seconds (CI)

It trains on one intra-op thread: this MLP gains nothing from more, and on a small shared
machine two of them spin against each other and against everything else (with two, the
full run took 15 minutes on 2 busy cores, a step 1 to 17 ms where one thread takes 1 ms).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import sentinel

LRS = (1e-4, 3e-4, 1e-3, 3e-3)
SEEDS = (1, 2, 3)
TARGET_LOSS = 0.05


def _optimizers() -> dict[str, tuple[Callable[..., torch.optim.Optimizer], float, float]]:
    """name → (factory(params, lr), gradient clip, the scale of the lr grid for it: SGD
    and Sophia take larger steps than Adam, Lion smaller, seed 004 §3.3)."""
    import pytorch_optimizer as po

    wd = 0.01
    return {
        "sgd_momentum": (lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, weight_decay=wd), 1.0, 30.0),
        "adamw": (lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=wd), 5.0, 1.0),
        "adafactor": (lambda p, lr: torch.optim.Adafactor(p, lr=lr, weight_decay=wd), 5.0, 10.0),
        "lamb": (lambda p, lr: po.Lamb(p, lr=lr, weight_decay=wd), 5.0, 10.0),
        "lion": (lambda p, lr: po.Lion(p, lr=lr, weight_decay=wd), 5.0, 1 / 3),
        "sophia": (lambda p, lr: po.SophiaH(p, lr=lr, weight_decay=wd, update_period=5), 5.0, 30.0),
    }


class Task:
    """A fixed regression task: a random two-layer teacher, 4,096 samples, split 90/10."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(4096, 32, generator=g)
        teacher = [torch.randn(32, 64, generator=g) / 32 ** 0.5, torch.randn(64, 1, generator=g) / 8]
        self.y = torch.tanh(self.x @ teacher[0]) @ teacher[1]

    def model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 1))

    def held_out(self, model: nn.Module) -> float:
        """The loss on the last 10% (never trained on)."""
        with torch.no_grad():
            return float(nn.functional.mse_loss(model(self.x[3686:]), self.y[3686:]))

    def batches(self, seed: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)

        def take() -> tuple[torch.Tensor, torch.Tensor]:
            idx = torch.randint(0, 3686, (64,), generator=g)  # the first 90%: the training split
            return self.x[idx], self.y[idx]
        return take


def train(task: Task, name: str, lr: float, seed: int, steps: int, phase: str, session: str,
          config: str | None, watch: bool = True) -> dict[str, Any]:
    """One run; returns its final and first loss, whether it diverged, and its run name."""
    factory, clip, _ = _optimizers()[name]
    model = task.model(seed)
    opt = factory(model.parameters(), lr)
    run = f"{session}-{phase}-{name}-{lr:g}-s{seed}"
    tags = {"optimizer": name, "lr": f"{lr:g}", "seed": str(seed), "phase": phase, "session": session}
    mon = sentinel.watch(model, opt, run=run, job="shootout", engine="thread", listen="127.0.0.1:0",
                         tags=tags, config=config, update_every=10, memory_every=10) if watch else None
    take = task.batches(seed)
    hessian = name == "sophia"
    first = last = float("nan")
    before = task.held_out(model)
    try:
        for step in range(steps):
            x, y = take()
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward(create_graph=hessian)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            if mon is not None:
                mon.log(loss=loss)
            last = float(loss.detach())
            if step == 0:
                first = last
            if not math.isfinite(last):
                break
    finally:
        if mon is not None:
            mon.close()
    after = task.held_out(model)
    return {"run": run, "first": first, "final": last, "held_out": (before, after),
            "diverged": not math.isfinite(last) or last > first, "blew_up": not after < 1.5 * before}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a reduced form: 2 lrs, 10 sweep / 20 main steps")
    ap.add_argument("--db", help="history file (default: sentinel's per-user one)")
    ap.add_argument("--only", help="comma-separated optimizer names")
    a = ap.parse_args()
    torch.set_num_threads(1)  # a tiny MLP gains nothing from intra-op threads (see the docstring)
    sweep_steps, main_steps = (10, 20) if a.quick else (200, 500)
    lrs = (3e-4, 1e-3) if a.quick else LRS
    table = _optimizers()
    names = a.only.split(",") if a.only else list(table)
    session = time.strftime("%m%d-%H%M%S")
    config = None
    if a.db:
        fd, config = tempfile.mkstemp(suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(f"history: {{path: {os.path.abspath(a.db)!r}}}\n")
    task = Task()
    main_runs: list[str] = []
    t0 = time.monotonic()
    for name in names:
        scale = table[name][2]
        warm = train(task, name, 1e-3 * scale, 0, 10, "warmup", session, config, watch=False)
        b, e = warm["held_out"]
        if warm["blew_up"]:
            print(f"{name}: diverged in the 10-step warm-up (held-out loss {b:.4g} → {e:.4g}); skipped")
            continue
        grid = [float(f"{lr * scale:.3g}") for lr in lrs]
        sweep = [(lr, train(task, name, lr, 0, sweep_steps, "sweep", session, config)) for lr in grid]
        healthy = [(r["held_out"][1], lr) for lr, r in sweep if r["held_out"][1] < r["held_out"][0]]
        if not healthy:
            print(f"{name}: no lr of the sweep brought the held-out loss down; skipped")
            continue
        best = min(healthy)[1]
        print(f"{name}: warm-up held-out loss {b:.4g} → {e:.4g}; sweep (held-out loss) "
              + ", ".join(f"{lr:g}→{r['held_out'][1]:.4g}" for lr, r in sweep) + f"; keeping lr {best:g}")
        for seed in SEEDS:
            main_runs.append(train(task, name, best, seed, main_steps, "main", session, config)["run"])
    print(f"trained {len(main_runs)} main runs in {time.monotonic() - t0:.0f} s", flush=True)
    cmd = [sys.executable, "-m", "sentinel.cli", "compare", *main_runs, "--target-loss", str(TARGET_LOSS)]
    if a.db:
        cmd += ["--db", a.db]
    try:
        return subprocess.call(cmd)
    finally:
        if config:
            os.unlink(config)


if __name__ == "__main__":
    sys.exit(main())
