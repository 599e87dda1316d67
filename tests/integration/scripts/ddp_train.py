"""DDP with gloo on CPU, no sentinel import. argv: steps, a file to wait for before exiting."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

steps, wait_file = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
gen = torch.Generator().manual_seed(rank)
for i in range(steps):
    x = torch.randn(16, 8, generator=gen)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"rank {rank} trained", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(wait_file) and time.monotonic() < deadline:
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
