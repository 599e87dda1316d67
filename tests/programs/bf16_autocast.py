"""Mixed precision on the CPU as the AMP recipes write it: the forward pass under
``torch.autocast("cpu", dtype=torch.bfloat16)``, the loss and the backward outside it, the
weights staying float32; SGD with Nesterov momentum and weight decay.

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
torch.manual_seed(3)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)

gen = torch.Generator().manual_seed(3)
for step in range(steps):
    x = torch.randn(32, 16, generator=gen)
    target = (x[:, :4] > 0).long().sum(dim=1).clamp(max=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    loss = nn.functional.cross_entropy(logits.float(), target)
    optimizer.zero_grad()
    loss.backward()
    ref.step(loss, zoolib.total_norm(model.parameters()))
    optimizer.step()
    if mon is not None:
        mon.log(loss=loss)
    print(f"step {step} loss {loss.item()!r} logits {logits.dtype}")

os.makedirs(out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(out_dir, "model.pt"))
ref.saved_file(os.path.join(out_dir, "model.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
