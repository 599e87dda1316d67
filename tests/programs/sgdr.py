"""SGDR, in the shape of the CIFAR and Kaggle training scripts that use PyTorch's
``CosineAnnealingWarmRestarts``: SGD with Nesterov momentum and weight decay, the scheduler
stepped every batch with a fractional epoch (``scheduler.step(epoch + i / iters)``, as its
documentation shows), cycles of 5 epochs: at each restart the lr goes back from about 0 to
its peak in one batch, and the training loss climbs out of the minimum it had reached (from
0.07 to 0.45 at the first restart here) before it comes back down within the cycle.

The reference: per step, the batch's loss and its gradient norm.

argv: OUT_DIR [EPOCHS]
"""

import os
import sys

import torch
import zoolib
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 15
torch.manual_seed(0)
N = 4096
X = torch.randn(N, 32)
y = (X @ torch.randn(32, 10) + 0.5 * torch.randn(N, 10)).argmax(1)
loader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
scheduler = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=5, T_mult=1)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)

iters = len(loader)
for epoch in range(epochs):
    total = 0.0
    for i, (inputs, labels) in enumerate(loader):
        optimizer.zero_grad()
        loss = criterion(model(inputs), labels)
        loss.backward()
        ref.step(loss, zoolib.total_norm(model.parameters()))
        optimizer.step()
        scheduler.step(epoch + i / iters)
        if mon is not None:
            mon.log(loss=loss)
        total += loss.item()
    print(f"epoch {epoch} loss {total / iters!r} lr {optimizer.param_groups[0]['lr']!r}")

os.makedirs(out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(out_dir, "sgdr.pt"))
ref.saved_file(os.path.join(out_dir, "sgdr.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
