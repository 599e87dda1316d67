"""Reptile on sine waves in the shape of the public PyTorch ports (gabrielhuang/reptile-pytorch's
meta-training loop): per task a fresh copy of the meta-model (``clone()``: ``deepcopy``) and a
fresh Adam over it, a few inner steps on the task's batches, then the meta-model's gradient
set to the distance travelled (``point_grad_to``) and a step of the meta-optimizer, an SGD
made once. At the end the meta-model is fine-tuned on a held-out task, as its evaluation
does: a copy, a fresh optimizer, ``FINETUNE`` steps, each of ``STEP_SECONDS`` at least (a
step of a real model's length, where this one's takes under a millisecond). No sentinel
import.

Prints the inner losses every 25 tasks and every 10th fine-tuned loss with repr: a monitor
must not change a bit of them.

argv: [TASKS] [INNER] [FINETUNE] [STEP_SECONDS]
"""

import copy
import math
import sys
import time

import torch
from torch import nn

tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 100
inner = int(sys.argv[2]) if len(sys.argv) > 2 else 5
finetune = int(sys.argv[3]) if len(sys.argv) > 3 else 60
step_seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
torch.manual_seed(0)
gen = torch.Generator().manual_seed(1)


class SineModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden1 = nn.Linear(1, 40)
        self.hidden2 = nn.Linear(40, 40)
        self.out = nn.Linear(40, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden2(torch.relu(self.hidden1(x)))))

    def clone(self) -> "SineModel":
        return copy.deepcopy(self)

    def point_grad_to(self, target: nn.Module) -> None:
        """Set each gradient to (own - target): an SGD step of lr 1 on it would land on target."""
        for p, t in zip(self.parameters(), target.parameters()):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.data.zero_()
            p.grad.data.add_(p.data - t.data)


def task() -> tuple[float, float]:
    return float(torch.rand(1, generator=gen) * 4.9 + 0.1), float(torch.rand(1, generator=gen) * math.pi)


def batch(amplitude: float, phase: float, n: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(n, 1, generator=gen) * 10.0 - 5.0
    return x, amplitude * torch.sin(x + phase)


def train_on(net: nn.Module, optimizer: torch.optim.Optimizer, amplitude: float, phase: float,
             steps: int, step_seconds: float = 0.0) -> list[float]:
    losses = []
    for _ in range(steps):
        if step_seconds:
            time.sleep(step_seconds)
        x, y = batch(amplitude, phase)
        loss = nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


meta_net = SineModel()
meta_optimizer = torch.optim.SGD(meta_net.parameters(), lr=1.0)
for meta_iteration in range(tasks):
    lr = 1.0 - meta_iteration / tasks  # the meta step size decays linearly
    for group in meta_optimizer.param_groups:
        group["lr"] = lr
    net = meta_net.clone()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.0, 0.999))
    amplitude, phase = task()
    losses = train_on(net, optimizer, amplitude, phase, inner)
    meta_net.point_grad_to(net)
    meta_optimizer.step()
    if meta_iteration % 25 == 0:
        print(f"task {meta_iteration}: inner losses {[repr(v) for v in losses]}")

net = meta_net.clone()
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.0, 0.999))
amplitude, phase = task()
losses = train_on(net, optimizer, amplitude, phase, finetune, step_seconds)
print("fine-tuned:", [repr(v) for v in losses[::10]], repr(losses[-1]))
