"""A training script that evaluates its checkpoint by running another script as a process of
its own after each phase (``subprocess.run([sys.executable, "linear_probe.py", CKPT])``, as
self-supervised repositories run their linear evaluation), waiting for it, then training on.
No sentinel import.

Prints each phase's last loss and what the probe printed.

argv: CKPT [PHASES] [STEPS]
"""

import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

ckpt = sys.argv[1]
phases = int(sys.argv[2]) if len(sys.argv) > 2 else 2
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 100
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
w = torch.randn(8, 1)
for phase in range(phases):
    for _ in range(steps):
        x = torch.randn(32, 8)
        loss = nn.functional.mse_loss(model(x), x @ w)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), ckpt)
    probe = subprocess.run([sys.executable, str(Path(__file__).with_name("linear_probe.py")), ckpt, "60"],
                           capture_output=True, text=True, check=True)
    print(f"phase {phase}: loss {loss.item()!r}, {probe.stdout.strip()}", flush=True)
