"""Multi-task training with an optimizer per task, each over the shared trunk and the task's
head, stepped in turn on each batch: a regression head's Adam on its MSE, then a
classification head's Adam on its cross-entropy. No sentinel import.

Prints both losses of every 10th step with repr.

argv: [STEPS]
"""

import sys

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
torch.manual_seed(0)
trunk = nn.Sequential(nn.Linear(16, 64), nn.ReLU())
head_a, head_b = nn.Linear(64, 1), nn.Linear(64, 4)
opt_a = torch.optim.Adam(list(trunk.parameters()) + list(head_a.parameters()), lr=1e-3)
opt_b = torch.optim.Adam(list(trunk.parameters()) + list(head_b.parameters()), lr=1e-3)
w, protos = torch.randn(16, 1), torch.randn(4, 16)
for step in range(steps):
    x = torch.randn(64, 16)
    loss_a = nn.functional.mse_loss(head_a(trunk(x)), x @ w)
    opt_a.zero_grad()
    loss_a.backward()
    opt_a.step()
    y = torch.randint(0, 4, (64,))
    loss_b = nn.functional.cross_entropy(head_b(trunk(protos[y] + torch.randn(64, 16))), y)
    opt_b.zero_grad()
    loss_b.backward()
    opt_b.step()
    if step % 10 == 0:
        print(step, repr(loss_a.item()), repr(loss_b.item()), flush=True)
