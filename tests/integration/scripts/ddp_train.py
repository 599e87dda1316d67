"""DDP with gloo on CPU, no sentinel import. argv: steps, a file to wait for before exiting,
and optionally a fault on rank 1: ``perturb`` (its gradients are scaled after the
all-reduce from step 10 on: a desynchronised replica) or ``slow`` (it loads each batch
30 ms slower: a straggler), or ``nan`` (rank 0's last batch holds a NaN: the all-reduce
makes every rank's gradients NaN)."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

steps, wait_file = int(sys.argv[1]), sys.argv[2]
fault = sys.argv[3] if len(sys.argv) > 3 else ""
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
gen = torch.Generator().manual_seed(rank)
for i in range(steps):
    x = torch.randn(16, 8, generator=gen)
    if fault == "slow" and rank == 1:
        time.sleep(0.03)
    if fault == "nan" and rank == 0 and i == steps - 1:
        x[0, 0] = float("nan")
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    if fault == "perturb" and rank == 1 and i >= 10:
        with torch.no_grad():
            for p in model.parameters():
                p.grad.mul_(1.01)
    opt.step()
print(f"rank {rank} trained", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(wait_file) and time.monotonic() < deadline:
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
