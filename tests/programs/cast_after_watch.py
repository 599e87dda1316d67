"""A model cast after monitoring began, as scripts that pick the precision late do: three
steps in float32, then ``model.double()`` (the same Parameter objects, new float64 data,
so the optimizer keeps them), three steps in float64, then ``model.half()`` and three
steps in float16. Under ``ZOO_WATCH=1`` ``sentinel.watch`` is called before the first
cast; under ``sentinel run`` the monitor attaches at the first step, also before it.

argv: OUT_DIR
"""

import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
torch.manual_seed(4)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)

gen = torch.Generator().manual_seed(4)
dtype = torch.float32
for step in range(9):
    if step == 3:
        model.double()
        dtype = torch.float64
    elif step == 6:
        model.half()
        dtype = torch.float16
    x = torch.randn(16, 8, generator=gen).to(dtype)
    y = x.sum(dim=1, keepdim=True).tanh()
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    ref.step(loss, zoolib.total_norm(model.parameters()))
    optimizer.step()
    if mon is not None:
        mon.log(loss=loss)
    print(f"step {step} {dtype} loss {loss.item()!r}")

os.makedirs(out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(out_dir, "model.pt"))
ref.saved_file(os.path.join(out_dir, "model.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
