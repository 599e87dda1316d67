"""A training script that knows nothing of sentinel and handles signals the way public ones
do: SIGUSR1/SIGUSR2 save a checkpoint and training goes on (Lightning's Slurm auto-requeue,
submitit), SIGTERM and SIGHUP save and stop (preemption), Ctrl-C ends training early and the
script still saves and evaluates (pytorch/examples' word_language_model), and SIGQUIT too.

argv: a folder. Each signal it handles appends its name to ``signals`` there; ``ready`` is
printed once training runs. Training goes on until a signal stops it or ``steps`` steps
(argv[2], default 100000) are done; then it saves ``model.pt`` and prints ``done``, exit 0.
"""

import os
import signal
import sys
import time

import torch
from torch import nn

folder = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
stop = False


def note(name: str) -> None:
    with open(os.path.join(folder, "signals"), "a") as f:
        f.write(name + "\n")


def checkpoint(signum: int, frame: object) -> None:
    note(signal.Signals(signum).name)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(folder, "ckpt.pt"))


def preempted(signum: int, frame: object) -> None:
    global stop
    note(signal.Signals(signum).name)
    stop = True


signal.signal(signal.SIGUSR1, checkpoint)
signal.signal(signal.SIGUSR2, checkpoint)
signal.signal(signal.SIGTERM, preempted)
signal.signal(signal.SIGHUP, preempted)
signal.signal(signal.SIGQUIT, preempted)

try:
    for i in range(steps):
        x = torch.randn(16, 8)
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i == 2:
            print("ready", flush=True)
        if stop:
            break
        time.sleep(0.01)
except KeyboardInterrupt:
    note("SIGINT")
    print("Exiting from training early", flush=True)
    time.sleep(1.0)  # the script's clean-up (a save, an evaluation): a second Ctrl-C would cut it short
torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
print("done", flush=True)
