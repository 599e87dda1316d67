"""A script started by ``accelerate launch`` (its single process on the CPU: the CLI, a
Python that imports torch, runs it as a process of its own), trained with an
``Accelerator``. Knows nothing of Sentinel.

argv: STEPS
"""

import sys

import torch
from accelerate import Accelerator
from torch import nn

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(int(sys.argv[1])):
    x = torch.randn(32, 16)
    loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
print(f"done: {loss.item():.6f}", flush=True)
