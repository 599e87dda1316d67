"""Stochastic weight averaging in the shape of the ``torch.optim.swa_utils`` tutorial
(and the SWA recipes built on it), with a ``ReduceLROnPlateau`` scheduler before SWA
starts and activation checkpointing (``torch.utils.checkpoint``, ``use_reentrant=False``)
in the model's forward: ``AveragedModel`` (a deepcopy of the model, made after
``sentinel.watch`` with ``ZOO_WATCH=1``), ``SWALR`` from ``swa_start`` on,
``scheduler.step(val_loss)`` before it, ``update_bn`` over the loader, then
``torch.save(swa_model.state_dict())``, ``torch.save(swa_model)`` and a checkpoint with
the schedulers' states, each loaded back.

argv: OUT_DIR [EPOCHS]
"""

import os
import sys

import torch
import zoolib
from models import CheckpointedNet
from torch import nn
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 8
swa_start, batch, batches = 4, 16, 4
torch.manual_seed(21)
gen = torch.Generator().manual_seed(21)
x_all = torch.randn(batch * batches, 10, generator=gen)
y_all = (x_all[:, :4].argmax(dim=1) + (x_all[:, 4] > 1.5).long()) % 4
val_x, val_y = torch.randn(32, 10, generator=gen), None
val_y = (val_x[:, :4].argmax(dim=1) + (val_x[:, 4] > 1.5).long()) % 4
loader = [(x_all[i * batch:(i + 1) * batch], y_all[i * batch:(i + 1) * batch]) for i in range(batches)]

model = CheckpointedNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)
swa_model = AveragedModel(model)  # a deepcopy of the (watched) model
scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=0)
swa_scheduler = SWALR(optimizer, swa_lr=0.02, anneal_epochs=2)
loss_fn = nn.CrossEntropyLoss()
ref = zoolib.Reference()
for epoch in range(epochs):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        ref.step(loss, zoolib.total_norm(model.parameters()))
        optimizer.step()
        if mon is not None:
            mon.log(loss=loss)
    model.eval()
    with torch.no_grad():
        val_loss = loss_fn(model(val_x), val_y)
    if epoch >= swa_start:
        swa_model.update_parameters(model)
        swa_scheduler.step()
    else:
        scheduler.step(val_loss)
    print(f"epoch {epoch} loss {loss.item()!r} val {val_loss.item()!r} lr {optimizer.param_groups[0]['lr']!r}")

update_bn(loader, swa_model)  # recompute BatchNorm statistics for the averaged weights
swa_model.eval()
with torch.no_grad():
    swa_val = loss_fn(swa_model(val_x), val_y)
print("swa val", repr(swa_val.item()), "averaged", int(swa_model.n_averaged))
os.makedirs(out_dir, exist_ok=True)
files = {name: os.path.join(out_dir, name) for name in ("swa_state.pt", "swa_model.pt", "checkpoint.pt")}
torch.save(swa_model.state_dict(), files["swa_state.pt"])
torch.save(swa_model, files["swa_model.pt"])
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "swa_scheduler": swa_scheduler.state_dict(), "epoch": epochs}, files["checkpoint.pt"])
for path in files.values():
    ref.saved_file(path)
back = torch.load(files["swa_model.pt"], weights_only=False)
again = AveragedModel(CheckpointedNet())
again.load_state_dict(torch.load(files["swa_state.pt"], weights_only=True))
ckpt = torch.load(files["checkpoint.pt"], weights_only=False)
with torch.no_grad():
    print("reloaded", repr(float(back(val_x).sum())), repr(float(again.eval()(val_x).sum())),
          ckpt["scheduler"]["num_bad_epochs"], repr(ckpt["swa_scheduler"]["_last_lr"][0]))
if mon is not None:
    mon.close()
ref.finish(model, swa_model)
