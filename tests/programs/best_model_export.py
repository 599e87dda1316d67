"""Copies and exports of a model mid-training, as the transfer-learning tutorial and most
fine-tuning scripts do: ``best_model = copy.deepcopy(model)`` whenever the validation
loss improves (after the first optimizer step, when a zero-code monitor is attached), an
EMA copy updated in place after each step (timm's ``ModelEmaV2`` shape), and at the end
``torch.save(best_model)``, ``pickle.dump`` of the EMA model, ``torch.jit.trace`` and
``torch.jit.script`` of the trained model saved with ``torch.jit.save``; each is loaded
back and run.

argv: OUT_DIR [STEPS]
"""

import copy
import os
import pickle
import sys

import torch
import zoolib
from models import Net
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
torch.manual_seed(12)
model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)
gen = torch.Generator().manual_seed(12)
val_x = torch.randn(16, 1, 12, 12, generator=gen)
val_y = torch.randint(0, 10, (16,), generator=gen)
ema = None
best_model, best_loss = None, float("inf")
for step in range(steps):
    model.train()
    x = torch.randn(16, 1, 12, 12, generator=gen)
    y = torch.randint(0, 10, (16,), generator=gen)
    loss = nn.functional.nll_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    ref.step(loss, zoolib.total_norm(model.parameters()))
    optimizer.step()
    if mon is not None:
        mon.log(loss=loss)
    if ema is None:
        ema = copy.deepcopy(model).eval()
    else:
        with torch.no_grad():
            for e, p in zip(ema.state_dict().values(), model.state_dict().values()):
                e.copy_(e * 0.9 + p * 0.1) if e.is_floating_point() else e.copy_(p)
    model.eval()
    with torch.no_grad():
        val = nn.functional.nll_loss(model(val_x), val_y).item()
    if val < best_loss:
        best_loss, best_model = val, copy.deepcopy(model)
    print(f"step {step} loss {loss.item()!r} val {val!r}")

os.makedirs(out_dir, exist_ok=True)
files = {name: os.path.join(out_dir, name) for name in ("best.pt", "ema.pkl", "traced.pt", "scripted.pt")}
torch.save(best_model, files["best.pt"])
with open(files["ema.pkl"], "wb") as f:
    pickle.dump(ema, f)
model.eval()
torch.jit.save(torch.jit.trace(model, val_x[:2]), files["traced.pt"])
torch.jit.save(torch.jit.script(model), files["scripted.pt"])
for path in files.values():
    ref.saved_file(path)
with open(files["ema.pkl"], "rb") as f:
    back = [torch.load(files["best.pt"], weights_only=False), pickle.load(f),
            torch.jit.load(files["traced.pt"]), torch.jit.load(files["scripted.pt"])]
with torch.no_grad():
    print("reloaded", [repr(float(m(val_x).sum())) for m in back])
if mon is not None:
    mon.close()
ref.finish(model)
