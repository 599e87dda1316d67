"""DDP with the optimizer's state sharded across ranks, in the shape of PyTorch's
"Shard Optimizer States with ZeroRedundancyOptimizer" recipe and the scripts built on it:
``ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=…)`` over
a DDP model (it holds a local AdamW over this rank's shard of the parameters, steps that
one, then broadcasts the updated shards), a ``StepLR`` on the wrapper, and at the end
``consolidate_state_dict(to=0)`` with rank 0 saving the optimizer's whole state and the model.

Run plainly it is world size 1 (``init_process_group`` from the env:// variables set here);
under torchrun with 2 ranks each rank holds the state of about half the parameters.

The reference: per optimizer step, the loss and the gradient norm (DDP's all-reduced
gradients, the same on every rank).

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import torch.distributed as dist
import zoolib
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
zoolib.env_rendezvous()  # torchrun's variables, or a world of one
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(3)
model = DDP(nn.Sequential(*[nn.Linear(24, 24) for _ in range(5)], nn.Linear(24, 1)))
optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=3e-3,
                                    weight_decay=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
gen = torch.Generator().manual_seed(100 + rank)
ref = zoolib.Reference()
for step in range(1, steps + 1):
    x = torch.randn(32, 24, generator=gen)
    loss = nn.functional.mse_loss(model(x), x[:, :4].sum(1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    ref.step(loss, zoolib.total_norm(model.parameters()))
    optimizer.step()
    scheduler.step()
    if rank == 0 and step % 10 == 0:
        print(f"step {step} loss {loss.item()!r}")
optimizer.consolidate_state_dict(to=0)
if rank == 0:
    os.makedirs(out_dir, exist_ok=True)
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
               os.path.join(out_dir, "checkpoint.pt"))
    ref.saved_file(os.path.join(out_dir, "checkpoint.pt"))
dist.barrier()
dist.destroy_process_group()
ref.finish(model.module)
