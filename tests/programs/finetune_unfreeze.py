"""Fine-tuning in two phases, as transfer-learning tutorials and fast.ai-style scripts do:
a pretrained backbone frozen (``requires_grad = False``) while a new head trains with its
own Adam, then the backbone unfrozen and a new Adam made over both, the backbone's group
first at a tenth of the head's learning rate. One training of one model throughout: the
steps go on across the phases.

The reference: per step, the loss and the norm of the gradients the step's optimizer
applies (the head's in phase one, all in phase two).

argv: OUT_DIR [STEPS_PER_PHASE]
"""

import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
torch.manual_seed(6)
backbone = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
head = nn.Linear(32, 4)
model = nn.Sequential(backbone, head)
ref = zoolib.Reference()
gen = torch.Generator().manual_seed(6)


def train(optimizer: torch.optim.Optimizer, phase: int) -> None:
    for step in range(steps):
        x = torch.randn(24, 10, generator=gen)
        y = (x[:, :4].argmax(dim=1) + phase) % 4
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        ref.step(loss, zoolib.total_norm(model.parameters()))
        optimizer.step()
        print(f"phase {phase} step {step} loss {loss.item()!r}")


for p in backbone.parameters():
    p.requires_grad = False
train(torch.optim.Adam(head.parameters(), lr=1e-2), 1)
for p in backbone.parameters():
    p.requires_grad = True
train(torch.optim.Adam([{"params": backbone.parameters(), "lr": 1e-3}, {"params": head.parameters()}], lr=1e-2), 2)
os.makedirs(out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(out_dir, "finetuned.pt"))
ref.saved_file(os.path.join(out_dir, "finetuned.pt"))
ref.finish(model)
