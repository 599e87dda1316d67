"""DDP with gloo on CPU, no sentinel import: a NaN on every rank, once the test says so.
argv: steps, a gate file, a release file. The ranks train ``steps - 1`` clean steps, wait
for the gate (the test opens it once Prometheus has scraped every rank's
``sentinel_nonfinite_total`` at 0: ``increase()`` needs a sample from before the NaN, as a
real job's scrapes give it), then take the last step with a NaN in rank 0's batch (the
all-reduce makes every rank's gradients NaN), and wait for the release file."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def wait(path: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


steps, gate, release = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
gen = torch.Generator().manual_seed(rank)
for i in range(steps):
    if i == steps - 1:
        wait(gate, 600)
    x = torch.randn(16, 8, generator=gen)
    if rank == 0 and i == steps - 1:
        x[0, 0] = float("nan")
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"rank {rank} trained", flush=True)
wait(release, 600)
dist.barrier()
dist.destroy_process_group()
