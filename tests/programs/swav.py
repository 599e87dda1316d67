"""Self-supervised pretraining in the shape of facebookresearch/swav's ``main_swav.py``
(and the VISSL and DeepCluster-v2 recipes that copy it): a backbone and a projection head,
a prototypes layer (a linear layer without bias) L2-normalised by hand before every
iteration, multi-crop views (two large, two small), codes from the Sinkhorn-Knopp
algorithm on the large crops' scores, the swapped prediction loss at temperature 0.1, the
prototypes' gradients dropped (``p.grad = None``) during the first iterations, a cosine
learning rate after a linear warmup set by hand each iteration, and apex's ``LARC`` around
SGD: a plain object (no ``torch.optim.Optimizer``) keeping the SGD as ``.optim`` and
showing its ``param_groups`` as its own, whose ``step()`` scales every parameter's
gradient by its trust ratio in place (weight decay folded in) before calling the SGD's
``step()``. The checkpoint holds the model's and LARC's state dicts.

Sentinel read the gradients at the SGD's step, after LARC had scaled them: the norm it
reported stayed at 0.014, the trust coefficient times the weights' norm, while the
loss's gradients went from 8.1 to 3.5.

The reference: per iteration, the loss and the norm of the gradients LARC is given.

argv: OUT_DIR [ITERATIONS]
"""

import math
import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 120
torch.manual_seed(11)
gen = torch.Generator().manual_seed(11)


class LARC:
    """apex.parallel.LARC's shape: a stand-in for the optimizer it wraps."""

    def __init__(self, optimizer: torch.optim.Optimizer, trust_coefficient: float = 0.02, clip: bool = True,
                 eps: float = 1e-8) -> None:
        self.optim = optimizer
        self.trust_coefficient = trust_coefficient
        self.eps = eps
        self.clip = clip

    @property
    def param_groups(self) -> list[dict]:
        return self.optim.param_groups

    def state_dict(self) -> dict:
        return self.optim.state_dict()

    def zero_grad(self) -> None:
        self.optim.zero_grad()

    def step(self) -> None:
        with torch.no_grad():
            weight_decays = []
            for group in self.optim.param_groups:
                weight_decay = group.get("weight_decay", 0)
                weight_decays.append(weight_decay)
                group["weight_decay"] = 0
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    param_norm = torch.norm(p.data)
                    grad_norm = torch.norm(p.grad.data)
                    if param_norm != 0 and grad_norm != 0:
                        adaptive_lr = self.trust_coefficient * param_norm / (
                            grad_norm + param_norm * weight_decay + self.eps)
                        if self.clip:
                            adaptive_lr = min(adaptive_lr / group["lr"], 1)
                        p.grad.data += weight_decay * p.data
                        p.grad.data *= adaptive_lr
        self.optim.step()
        for i, group in enumerate(self.optim.param_groups):
            group["weight_decay"] = weight_decays[i]


class SwAVNet(nn.Module):
    def __init__(self, width: int = 32, feat: int = 16, prototypes: int = 24) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(width, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64))
        self.projection_head = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, feat))
        self.prototypes = nn.Linear(feat, prototypes, bias=False)

    def forward(self, crops: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        z = nn.functional.normalize(self.projection_head(self.backbone(torch.cat(crops))), dim=1, p=2)
        return z, self.prototypes(z)


@torch.no_grad()
def distributed_sinkhorn(out: torch.Tensor, epsilon: float = 0.05, iters: int = 3) -> torch.Tensor:
    q = torch.exp(out / epsilon).t()
    b, k = q.shape[1], q.shape[0]
    q /= torch.sum(q)
    for _ in range(iters):
        q /= torch.sum(q, dim=1, keepdim=True)
        q /= k
        q /= torch.sum(q, dim=0, keepdim=True)
        q /= b
    q *= b
    return q.t()


def views(batch: int = 32) -> list[torch.Tensor]:
    x = torch.randn(batch, 32, generator=gen)
    large = [x + 0.1 * torch.randn(x.shape, generator=gen) for _ in range(2)]
    small = [(x + 0.3 * torch.randn(x.shape, generator=gen)) * (torch.rand(x.shape, generator=gen) > 0.3)
             for _ in range(2)]
    return large + small


model = SwAVNet()
base_lr, final_lr, warmup, temperature, freeze_iters, bs = 0.6, 0.0006, 10, 0.1, 5, 32
optimizer = LARC(torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9, weight_decay=1e-6),
                 trust_coefficient=0.001, clip=False)
schedule = [base_lr * (i + 1) / warmup for i in range(warmup)] + [
    final_lr + 0.5 * (base_lr - final_lr) * (1 + math.cos(math.pi * t / (iterations - warmup)))
    for t in range(iterations - warmup)]
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)
for it in range(iterations):
    for group in optimizer.param_groups:
        group["lr"] = schedule[it]
    with torch.no_grad():  # normalize the prototypes
        w = nn.functional.normalize(model.prototypes.weight.data.clone(), dim=1, p=2)
        model.prototypes.weight.copy_(w)
    crops = views(bs)
    embedding, output = model(crops)
    embedding = embedding.detach()
    loss = torch.zeros(())
    for i, crop_id in enumerate([0, 1]):
        with torch.no_grad():
            q = distributed_sinkhorn(output[bs * crop_id: bs * (crop_id + 1)].detach())
        subloss = torch.zeros(())
        for v in [v for v in range(len(crops)) if v != crop_id]:
            x = output[bs * v: bs * (v + 1)] / temperature
            subloss = subloss - torch.mean(torch.sum(q * nn.functional.log_softmax(x, dim=1), dim=1))
        loss = loss + subloss / (len(crops) - 1)
    loss = loss / 2
    optimizer.zero_grad()
    loss.backward()
    if it < freeze_iters:  # cancel the prototypes' gradients during the first iterations
        for name, p in model.named_parameters():
            if "prototypes" in name:
                p.grad = None
    ref.step(loss, zoolib.total_norm(p for p in model.parameters() if p.grad is not None))
    optimizer.step()
    if mon is not None:
        mon.log(loss=loss)
    if it % 30 == 0:
        print(f"iteration {it} loss {loss.item()!r} lr {schedule[it]!r}")

os.makedirs(out_dir, exist_ok=True)
path = os.path.join(out_dir, "checkpoint.pth.tar")
torch.save({"epoch": 1, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
ref.saved_file(path)
if mon is not None:
    mon.close()
ref.finish(model)
