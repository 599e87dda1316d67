"""Train, save a checkpoint, and resume from it in a later run, as nanoGPT's ``train.py``
does (``init_from="resume"``): the model and AdamW are made afresh, load their states and
``iter_num`` from ``ckpt.pt``, and training goes on from there.

argv: OUT_DIR ITERS [--resume]
"""

import os
import sys

import torch
from torch import nn

out_dir, iters = sys.argv[1], int(sys.argv[2])
resume = "--resume" in sys.argv[3:]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
iter_num = 0
if resume:
    ckpt = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    iter_num = ckpt["iter_num"]
gen = torch.Generator().manual_seed(1000 + iter_num)
for _ in range(iters):
    x = torch.randn(64, 8, generator=gen)
    y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2]
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    print(f"iter {iter_num}: loss {loss.item()!r}")
    iter_num += 1
os.makedirs(out_dir, exist_ok=True)
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num},
           os.path.join(out_dir, "ckpt.pt"))
