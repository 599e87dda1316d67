"""DDP with gloo on CPU for the dashboards' several-rank panels, run under `sentinel run`:
argv: steps, a file to wait for before exiting. It clips (max_norm 0.05, so most steps
clip), scales the loss with a CPU GradScaler passed to `sentinel.watch` (one overflow at
step 5 is skipped and halves the scale), and rank 1 loads its batches slower (a straggler).
After training, rank 0 evaluates alone (0.6 s of ``model.module`` forwards under
``no_grad``, heartbeats every 0.2 s) while rank 1 waits for it in a barrier."""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import sentinel

steps, wait_file = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu")
mon = sentinel.watch(model, opt, scaler=scaler, heartbeat_seconds=0.2)
gen = torch.Generator().manual_seed(rank)
for i in range(steps):
    x = torch.randn(16, 8, generator=gen)
    time.sleep(0.02 if rank == 1 else 0.005)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    if i == 5:
        loss = loss * float("inf")  # an overflow: the scaler skips this step
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    scaler.step(opt)
    scaler.update()
    mon.log(loss=loss)
if rank == 0:
    model.module.eval()
    end = time.monotonic() + 0.6
    with torch.no_grad():
        while time.monotonic() < end:
            model.module(torch.randn(64, 8, generator=gen))
            time.sleep(0.01)
dist.barrier()
print(f"rank {rank} trained", flush=True)
deadline = time.monotonic() + 300
while not os.path.exists(wait_file) and time.monotonic() < deadline:
    time.sleep(0.05)
mon.close()
dist.barrier()
dist.destroy_process_group()
