"""Sharpness-aware minimisation in the shape of the widely copied ``SAM`` optimizer
(davda54/sam and its many copies): a ``torch.optim.Optimizer`` subclass that builds its
base optimizer (SGD with momentum) over its own ``param_groups`` and then shares them, two
forward-backward passes a step (``first_step`` climbs to the worst nearby weights,
``second_step`` goes back and lets the base optimizer step with the gradients found
there), the BatchNorm running statistics frozen for the second pass, and the first pass's
loss as the one the script prints ("use this loss for any training statistics").

The reference: per step, the loss and the norm of the gradients of the pass whose gradients
the base optimizer applies: the second pass's, at the perturbed weights (Sentinel's loss is
always the loss of the gradients a step applies; the first pass's were thrown away).

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import zoolib
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class SAM(torch.optim.Optimizer):
    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        if rho < 0.0:
            raise ValueError(f"rho must be non-negative, not {rho}")
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        norm = self._grad_norm()
        for group in self.param_groups:
            scale = group["rho"] / (norm + 1e-12)
            for p in group["params"]:
                if p.grad is None:
                    continue
                self.state[p]["old_p"] = p.data.clone()
                p.add_(p.grad * scale.to(p))
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.data = self.state[p]["old_p"]
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()

    def _grad_norm(self):
        return torch.stack([p.grad.norm(p=2) for g in self.param_groups for p in g["params"]
                            if p.grad is not None]).norm(p=2)

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self.base_optimizer.param_groups = self.param_groups


def running_stats(model: nn.Module, on: bool) -> None:
    """The BatchNorm layers' running statistics move on the first pass only."""
    for m in model.modules():
        if isinstance(m, _BatchNorm):
            if on:
                m.momentum = getattr(m, "backup_momentum", m.momentum)
            else:
                m.backup_momentum = m.momentum
                m.momentum = 0


out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
torch.manual_seed(3)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                      nn.Flatten(), nn.Linear(32, 10))
optimizer = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9, weight_decay=5e-4)
monitor = None
if zoolib.watching():
    import sentinel

    monitor = sentinel.watch(model, optimizer)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
ref = zoolib.Reference()
gen = torch.Generator().manual_seed(3)
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
for step in range(steps):
    x = torch.randn(16, 3, 8, 8, generator=gen)
    y = torch.randint(0, 10, (16,), generator=gen)
    running_stats(model, True)
    loss = criterion(model(x), y)  # the loss the script reports
    loss.backward()
    optimizer.first_step(zero_grad=True)
    running_stats(model, False)
    perturbed = criterion(model(x), y)
    perturbed.backward()
    ref.step(perturbed, zoolib.total_norm(model.parameters()))
    optimizer.second_step(zero_grad=True)
    scheduler.step()
    if monitor is not None:
        monitor.log(loss=perturbed)
    print(f"step {step} loss {loss.item()!r} lr {scheduler.get_last_lr()[0]!r}")
os.makedirs(out_dir, exist_ok=True)
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(out_dir, "sam.pt"))
ref.saved_file(os.path.join(out_dir, "sam.pt"))
ref.finish(model)
if monitor is not None:
    monitor.close()
