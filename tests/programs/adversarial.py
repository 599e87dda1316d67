"""Adversarial training with a PGD attack, in the shape of the robustness repositories
(Madry et al.'s training loop, "fast is better than free"): per step, a few attack passes
whose ``backward()`` takes the gradient of the loss with respect to a perturbation ``delta``
(and, as a side effect, fills the model's gradients too), each followed by a signed step
of ``delta`` projected onto an L-infinity ball; then ``opt.zero_grad()`` and the training
pass on the perturbed batch, whose gradients the step applies. SGD with momentum and
weight decay, a MultiStepLR schedule.

The reference: per step, the training pass's loss and its gradients' norm.

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
epsilon, alpha, attack_iters = 0.1, 0.04, 3
torch.manual_seed(8)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 5))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
scheduler = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[steps // 2], gamma=0.1)
criterion = nn.CrossEntropyLoss()
ref = zoolib.Reference()
gen = torch.Generator().manual_seed(8)
for step in range(steps):
    x = torch.randn(32, 12, generator=gen)
    y = x[:, :5].argmax(dim=1)
    delta = torch.zeros_like(x).uniform_(-epsilon, epsilon, generator=gen).requires_grad_(True)
    for _ in range(attack_iters):
        loss = criterion(model(x + delta), y)
        loss.backward()
        grad = delta.grad.detach()
        delta.data = (delta + alpha * torch.sign(grad)).clamp(-epsilon, epsilon)
        delta.grad.zero_()
    delta = delta.detach()
    output = model(x + delta)
    loss = criterion(output, y)
    opt.zero_grad()
    loss.backward()
    ref.step(loss, zoolib.total_norm(model.parameters()))
    opt.step()
    scheduler.step()
    print(f"step {step} robust loss {loss.item()!r} acc {(output.argmax(1) == y).float().mean().item()!r}")
os.makedirs(out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(out_dir, "robust.pt"))
ref.saved_file(os.path.join(out_dir, "robust.pt"))
ref.finish(model)
