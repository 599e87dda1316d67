"""Single-process DDP over gloo (``world_size=1``), as scripts written for torchrun are
often run on one machine for a smoke test: ``init_process_group`` from the env://
variables (set here when torchrun did not), the model wrapped in
``DistributedDataParallel``, a ``DistributedSampler``, Adam, ``model.module.state_dict()``
saved by rank 0, a barrier and ``destroy_process_group`` at the end. With ACCUM > 1 it
accumulates that many micro-batches a step, the all-reduce skipped for all but the last
under ``model.no_sync()`` (the DDP tutorial's and Accelerate's ``accumulate`` shape), each
micro-batch's loss divided by ACCUM.

argv: OUT_DIR [EPOCHS] [ACCUM]
"""

import contextlib
import os
import sys

import torch
import torch.distributed as dist
import zoolib
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
accum = int(sys.argv[3]) if len(sys.argv) > 3 else 1
zoolib.env_rendezvous()  # torchrun's variables, or a world of one
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(8)
xs = torch.randn(40, 6)
dataset = TensorDataset(xs, xs.sum(dim=1, keepdim=True))
sampler = DistributedSampler(dataset, shuffle=True, seed=8)
loader = DataLoader(dataset, batch_size=10 // accum, sampler=sampler)
model = DDP(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
ref = zoolib.Reference()
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    total = 0.0
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % accum == 0
        with contextlib.nullcontext() if last else model.no_sync():
            loss = nn.functional.mse_loss(model(x), y) / accum
            loss.backward()  # the all-reduce runs in here, at the last micro-batch
        total += loss.item()
        if not last:
            continue
        ref.step(total, zoolib.total_norm(model.parameters()))
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"epoch {epoch} batch {i} loss {total!r}")
        total = 0.0
if rank == 0:
    os.makedirs(out_dir, exist_ok=True)
    torch.save(model.module.state_dict(), os.path.join(out_dir, "model.pt"))
    ref.saved_file(os.path.join(out_dir, "model.pt"))
# every rank done before any tears its connections down: without the barrier, gloo on the
# CPU may abort a rank whose peer closed first (a SIGABRT seen once in CI, in the plain run)
dist.barrier()
dist.destroy_process_group()
ref.finish(model.module)
