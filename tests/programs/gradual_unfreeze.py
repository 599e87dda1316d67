"""Gradual unfreezing into one optimizer, as ULMFiT and the fine-tuning kernels that copy it
do: the head trains first; at each phase the next layer from the top is unfrozen and given
to the same AdamW with ``add_param_group``, at a learning rate 2.6 times lower than the
group above it (discriminative fine-tuning). The optimizer's state of the groups it had
goes on; its param groups grow from 1 to 4.

The reference: per step, the loss and the norm of the gradients the step applies (the
unfrozen layers').

argv: OUT_DIR [STEPS_PER_PHASE]
"""

import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
torch.manual_seed(7)
layers = [nn.Sequential(nn.Linear(12, 32), nn.Tanh()), nn.Sequential(nn.Linear(32, 32), nn.Tanh()),
          nn.Sequential(nn.Linear(32, 32), nn.Tanh())]
head = nn.Linear(32, 3)
model = nn.Sequential(*layers, head)
ref = zoolib.Reference()
gen = torch.Generator().manual_seed(7)
for p in model.parameters():
    p.requires_grad = False
for p in head.parameters():
    p.requires_grad = True
lr = 3e-3
optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)
for phase in range(4):
    if phase:  # unfreeze the next layer down, at a lower rate than the one above it
        layer = layers[-phase]
        for p in layer.parameters():
            p.requires_grad = True
        optimizer.add_param_group({"params": list(layer.parameters()), "lr": lr / 2.6 ** phase})
    for step in range(steps):
        x = torch.randn(32, 12, generator=gen)
        y = (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1).long()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        ref.step(loss, zoolib.total_norm(model.parameters()))
        optimizer.step()
        if mon is not None:
            mon.log(loss=loss)
        print(f"phase {phase} step {step} loss {loss.item()!r} groups {len(optimizer.param_groups)}")
os.makedirs(out_dir, exist_ok=True)
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(out_dir, "ulmfit.pt"))
ref.saved_file(os.path.join(out_dir, "ulmfit.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
