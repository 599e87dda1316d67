"""A plain loop (DDP with gloo when torchrun starts it), no sentinel import. argv: steps, the
poisoned step K, an output prefix, and ``reference`` to leave out step K's optimizer step
(and scheduler step) instead of poisoning it. Rank 1 (rank 0 alone) feeds a NaN at step K:
DDP's all-reduce makes every rank's gradients NaN. Each rank writes its final parameters
to ``<prefix>.rank<R>.pt``."""

import os
import sys

import torch
from torch import nn

steps, k, prefix = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
reference = len(sys.argv) > 4 and sys.argv[4] == "reference"
world = int(os.environ.get("WORLD_SIZE", "1"))
rank = 0
torch.manual_seed(0)
model: nn.Module = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
if world > 1:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
gen = torch.Generator().manual_seed(rank)
for i in range(1, steps + 1):
    x = torch.randn(16, 8, generator=gen)
    if i == k and not reference and rank == min(1, world - 1):
        x[0, 0] = float("nan")
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    if i == k and reference:
        continue
    opt.step()
    sched.step()
torch.save({n: p.detach() for n, p in model.named_parameters()}, f"{prefix}.rank{rank}.pt")
if world > 1:
    dist.barrier()
    dist.destroy_process_group()
