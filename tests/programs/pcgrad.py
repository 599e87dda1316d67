"""Multi-task learning with gradient surgery, as Pytorch-PCGrad's README and its copies
train: a shared trunk with two task heads, ``PCGrad(Adam(...))`` (pytorch-optimizer's),
``pc_backward([loss_a, loss_b])`` (a ``backward()`` per task between resets, each task's
gradients kept, the conflicting components projected out, the combination set as the
gradients) and ``step()``. The tasks pull the trunk apart: one target is the other's
negative in part, so their gradients conflict.

The reference: per step, the sum of the task losses (the step applies every task's
gradients) and the norm of the combined gradients the step applies.

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import zoolib
from pytorch_optimizer import PCGrad
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
torch.manual_seed(8)
trunk = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
heads = nn.ModuleList([nn.Linear(32, 1), nn.Linear(32, 1)])
model = nn.ModuleDict({"trunk": trunk, "heads": heads})
optimizer = PCGrad(torch.optim.Adam(model.parameters(), lr=3e-3))
ref = zoolib.Reference()
gen = torch.Generator().manual_seed(8)
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)
for step in range(steps):
    x = torch.randn(64, 16, generator=gen)
    z = trunk(x)
    task_a = nn.functional.mse_loss(heads[0](z), x[:, :2].sum(1, keepdim=True))
    task_b = nn.functional.mse_loss(heads[1](z), x[:, 2:3] - x[:, :1])
    optimizer.pc_backward([task_a, task_b])
    ref.step(task_a.detach() + task_b.detach(), zoolib.total_norm(model.parameters()))
    optimizer.step()
    if mon is not None:
        mon.log(loss=task_a + task_b)
    if step % 20 == 0:
        print(f"step {step} task a {task_a.item()!r} task b {task_b.item()!r}")
os.makedirs(out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(out_dir, "pcgrad.pt"))
ref.saved_file(os.path.join(out_dir, "pcgrad.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
