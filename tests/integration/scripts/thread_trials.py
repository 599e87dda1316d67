"""Trials in threads of one process, as Optuna runs them with ``n_jobs=2``: each thread
trains a model and an optimizer of its own, at once. The models are made up front in the
main thread (so the runs are the same with and without Sentinel, bit for bit); each thread
records its own loss at every step, and they are written to ``OUT`` as JSON. The SGD
trial clips its gradients, the Adam one does not.

``python thread_trials.py OUT [watch]``: with ``watch``, each thread calls
``sentinel.watch(model, opt, run="trials", capture_loss=True)`` itself."""

from __future__ import annotations

import json
import sys
import threading

import torch
from torch import nn

STEPS = 300


def trial(name: str, model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          losses: dict[str, list[float]], watch: bool) -> None:
    mon = None
    if watch:
        import sentinel

        mon = sentinel.watch(model, opt, run="trials", capture_loss=True)
    mine = losses[name] = []
    for step in range(STEPS):
        i = (step * 32) % len(x)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
        loss.backward()
        if name == "sgd":  # one trial clips: its clipping is not the other's
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        mine.append(loss.item())
    if mon is not None:
        mon.close()


def main() -> None:
    out, watch = sys.argv[1], sys.argv[2:] == ["watch"]
    torch.manual_seed(0)
    trials = []
    for name, make in (("sgd", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
                       ("adam", lambda p: torch.optim.Adam(p, lr=1e-3))):
        model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
        x = torch.randn(1024, 20)
        trials.append((name, model, make(model.parameters()), x, (x[:, 0] > 0).long()))
    losses: dict[str, list[float]] = {}
    threads = [threading.Thread(target=trial, args=(*t, losses, watch), name=t[0]) for t in trials]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in ("sgd", "adam"):
        print(f"{name} final {losses[name][-1]!r}")
    with open(out, "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
