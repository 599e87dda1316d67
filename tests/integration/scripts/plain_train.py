"""A training script that knows nothing of sentinel. argv: steps, then a file to wait for."""

import os
import sys
import time

import torch
from torch import nn

steps, wait_file = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for i in range(steps):
    x = torch.randn(16, 8)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(wait_file) and time.monotonic() < deadline:
    time.sleep(0.05)
print("exiting", flush=True)
