"""Training through ``torch.func.functional_call``, as functorch-style scripts (model
ensembling, meta-learning inner loops) do: the module's parameters are taken out as a
dict of leaf tensors, the forward runs ``functional_call(model, params, (x,))``, AdamW
steps those tensors (not the module's own Parameters, which stay where they were), and at
the end they are loaded back with ``load_state_dict``.

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import zoolib
from torch import nn
from torch.func import functional_call

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
torch.manual_seed(9)
model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
params = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
optimizer = torch.optim.AdamW(params.values(), lr=1e-2)
ref = zoolib.Reference()
gen = torch.Generator().manual_seed(9)
for step in range(steps):
    x = torch.randn(16, 5, generator=gen)
    y = (x[:, :2] * x[:, 2:4]).sum(dim=1, keepdim=True)
    loss = nn.functional.mse_loss(functional_call(model, params, (x,)), y)
    optimizer.zero_grad()
    loss.backward()
    ref.step(loss, zoolib.total_norm(params.values()))
    optimizer.step()
    print(f"step {step} loss {loss.item()!r}")
model.load_state_dict({k: v.detach() for k, v in params.items()})
os.makedirs(out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(out_dir, "model.pt"))
ref.saved_file(os.path.join(out_dir, "model.pt"))
ref.finish(model)
