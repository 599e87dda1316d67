"""Gradients from ``torch.autograd.grad`` instead of ``backward()``, as gradient-penalty
GANs (WGAN-GP), MAML and hand-rolled trainers do: the gradients are computed as a tuple
(with ``create_graph=True`` for a gradient penalty on the input), the penalty added,
``torch.autograd.grad`` again for the total, and each ``p.grad`` assigned before
``optimizer.step()``. ``backward()`` is never called.

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
torch.manual_seed(10)
critic = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))
params = list(critic.parameters())
optimizer = torch.optim.Adam(params, lr=1e-3, betas=(0.5, 0.9))
ref = zoolib.Reference()
gen = torch.Generator().manual_seed(10)
for step in range(steps):
    real = torch.randn(16, 4, generator=gen) + 1.0
    fake = torch.randn(16, 4, generator=gen)
    alpha = torch.rand(16, 1, generator=gen)
    interp = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    (gx,) = torch.autograd.grad(critic(interp).sum(), interp, create_graph=True)
    penalty = ((gx.norm(2, dim=1) - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + 10.0 * penalty
    grads = torch.autograd.grad(loss, params)
    for p, g in zip(params, grads):
        p.grad = g
    ref.step(loss, zoolib.total_norm(params))
    optimizer.step()
    print(f"step {step} loss {loss.item()!r} gp {penalty.item()!r}")
os.makedirs(out_dir, exist_ok=True)
torch.save(critic.state_dict(), os.path.join(out_dir, "critic.pt"))
ref.saved_file(os.path.join(out_dir, "critic.pt"))
ref.finish(critic)
