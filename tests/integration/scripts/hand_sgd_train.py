"""A loop with no optimizer: the parameters are updated by hand (word-language-model style);
a NaN in the loss at its 8th iteration. Prints iteration, loss and gradient norm."""
import math

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
lr = 0.05
for i in range(10):
    model.zero_grad()
    x = torch.randn(16, 4)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    if i == 7:
        loss = loss * float("nan")
    loss.backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    print(i, f"{loss.item():.6f}", math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters())))
