"""A hyperparameter sweep's launcher: one trial per learning rate, each its own
``python sweep_trials.py DIR LR`` process, run side by side; the launcher trains nothing.

Each trial trains 100 steps, then waits until every trial has (a file each in DIR), so the
three are certainly reporting at once, then trains 100 more and prints its final loss
(``repr``: bit-exact)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

LRS = ("0.002", "0.02", "0.1")


def trial(folder: str, lr: float) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x = torch.randn(1024, 20)
    y = (x[:, 0] > 0).long()
    loss = torch.tensor(0.0)
    for step in range(200):
        if step == 100:
            open(os.path.join(folder, f"trial-{lr}"), "w").close()
            deadline = time.monotonic() + 120
            while len([n for n in os.listdir(folder) if n.startswith("trial-")]) < len(LRS):
                if time.monotonic() > deadline:
                    sys.exit("the other trials never got to step 100")
                time.sleep(0.02)
        i = (step * 32) % 1024
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
        loss.backward()
        opt.step()
    print(f"lr={lr} final {loss.item()!r}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        trial(sys.argv[1], float(sys.argv[2]))
    else:
        procs = [subprocess.Popen([sys.executable, __file__, sys.argv[1], lr], stdout=subprocess.PIPE, text=True)
                 for lr in LRS]
        outs = [p.communicate()[0] for p in procs]  # in the order of LRS, whatever order they end in
        print("".join(outs), end="")
        sys.exit(max(p.returncode for p in procs))
