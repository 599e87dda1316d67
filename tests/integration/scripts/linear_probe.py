"""A linear probe of a checkpoint's first layer: frozen features, a linear classifier trained
by SGD. Run by ``train_and_probe.py`` as a process of its own. No sentinel import.

argv: CKPT [STEPS]
"""

import sys

import torch
from torch import nn

steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
torch.manual_seed(1)
features = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
features.load_state_dict({k: v for k, v in torch.load(sys.argv[1]).items() if k.startswith("0.")})
head = nn.Linear(32, 2)
optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
for _ in range(steps):
    x = torch.randn(64, 8)
    with torch.no_grad():
        f = features(x)
    loss = nn.functional.cross_entropy(head(f), (x[:, 0] > 0).long())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"probe loss {loss.item()!r}")
