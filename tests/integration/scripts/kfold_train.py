"""k-fold cross-validation in the shape of the public Kaggle notebooks: per fold a new model,
AdamW and a warmup-then-cosine LambdaLR, a DataLoader over the fold's rows, validation
after each epoch, the best epoch's state_dict saved, out-of-fold predictions; the fold's
model and optimizer dropped (``del``, ``gc.collect()``) before the next. No sentinel import.

Each fold prints its losses with repr and whether the models and optimizers of the earlier
folds are gone (as they are without a monitor): a monitor that kept them would hold a
model and its optimizer state per fold, which on a GPU is the next fold's OOM.

With ``--no-gc`` a fold's variables are just bound again by the next fold, with no ``del``
and no ``gc.collect()`` (as many scripts do): each fold then prints, after its first
optimizer step, whether the fold before's model and optimizer are gone (they are, without
a monitor: nothing else held them). It prints that twice: once its own model, optimizer
and scheduler are bound (before its first forward: the next trial's activations and
gradients must not meet the last one's weights, gradients and optimizer state on a GPU
that holds one model's), and after its first optimizer step.

argv: OUT_DIR [FOLDS] [EPOCHS] [--no-gc]
"""

import gc
import math
import os
import sys
import weakref

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

no_gc = "--no-gc" in sys.argv
args = [a for a in sys.argv[1:] if a != "--no-gc"]
out_dir = args[0]
folds = int(args[1]) if len(args) > 1 else 3
epochs = int(args[2]) if len(args) > 2 else 8
torch.manual_seed(0)
n, dim = 480, 12
x_all = torch.randn(n, dim)
y_all = (x_all[:, :4].sum(1, keepdim=True) * 3.0 + 5.0)  # a target far from a fresh model's output
fold_of = torch.arange(n) % folds
oof = torch.zeros(n, 1)
gone: list[tuple[weakref.ref, weakref.ref]] = []
os.makedirs(out_dir, exist_ok=True)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(dim, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 32), nn.GELU(),
                         nn.Linear(32, 1))


for fold in range(folds):
    torch.manual_seed(fold)
    train_idx, valid_idx = (fold_of != fold).nonzero().squeeze(1), (fold_of == fold).nonzero().squeeze(1)
    loader = DataLoader(TensorDataset(x_all[train_idx], y_all[train_idx]), batch_size=32, shuffle=True)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
    total = epochs * len(loader)
    warmup = total // 10

    def lr_lambda(step: int, warmup: int = warmup, total: int = total) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    if no_gc and fold:
        print(f"fold {fold} set up: the fold before's model and optimizer alive: "
              f"{(gone[-1][0]() is not None, gone[-1][1]() is not None)}", flush=True)
    best = math.inf
    for epoch in range(epochs):
        model.train()
        for i, (xb, yb) in enumerate(loader):
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            if no_gc and fold and epoch == 0 and i == 0:
                print(f"fold {fold} first step: the fold before's model and optimizer alive: "
                      f"{(gone[-1][0]() is not None, gone[-1][1]() is not None)}", flush=True)
        model.eval()
        with torch.no_grad():
            pred = model(x_all[valid_idx])
            valid = nn.functional.mse_loss(pred, y_all[valid_idx]).item()
        print(f"fold {fold} epoch {epoch} train {loss.item()!r} valid {valid!r}")
        if valid < best:
            best = valid
            oof[valid_idx] = pred
            torch.save(model.state_dict(), os.path.join(out_dir, f"fold{fold}.pt"))
    gone.append((weakref.ref(model), weakref.ref(optimizer)))
    if no_gc:
        continue
    del model, optimizer, scheduler, loss
    gc.collect()
    print(f"fold {fold} best {best!r}; earlier folds' models and optimizers alive: "
          f"{[(m() is not None, o() is not None) for m, o in gone]}", flush=True)
print(f"oof {nn.functional.mse_loss(oof, y_all).item()!r}")
