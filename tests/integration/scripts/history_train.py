"""A training script that knows nothing of sentinel. argv: steps, lr, then a JSON file for its losses."""

import json
import sys

import torch
from torch import nn

steps, lr, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
losses = []
for i in range(steps):
    x = torch.randn(16, 8)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
with open(out, "w") as f:
    json.dump(losses, f)
