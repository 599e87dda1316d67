"""examples/mnist's train loop with its ``optimizer.zero_grad()`` line lost (the classic bug):
``backward()`` adds each batch's gradients to the last ones, so every step applies the sum
of the gradients since the first. ``python no_zero_grad.py STEPS``."""

import sys

import torch
import torch.nn.functional as F  # noqa: N812  (the examples' spelling)
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
data = torch.randn(1024, 1, 8, 8)
target = data.flatten(1)[:, :10].argmax(1)
model.train()
steps = int(sys.argv[1])
for batch_idx in range(steps):
    i = batch_idx * 32 % 1024
    output = model(data[i:i + 32])
    loss = F.cross_entropy(output, target[i:i + 32])
    loss.backward()  # optimizer.zero_grad() is missing before it
    optimizer.step()
print(f"trained {steps} steps", flush=True)
