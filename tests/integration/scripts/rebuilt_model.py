"""A training script with a classic bug: the model is built again after its optimizer was
made (here by a reload of its configuration), so the optimizer steps the first model's
parameters while the loss is computed with the second's. Nothing trains; the script runs
to its end. Knows nothing of Sentinel.

argv: STEPS
"""

import sys

import torch
from torch import nn

steps = int(sys.argv[1])


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


torch.manual_seed(0)
model = build()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
model = build()  # "reload the model from its config": the optimizer still holds the first one's
for step in range(steps):
    x = torch.randn(64, 8)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"trained {steps} steps, loss {loss.item():.3f}", flush=True)
