"""Tensor parallelism in the shape of PyTorch's TP tutorial (``examples/distributed/
tensor_parallelism``) and the torchtitan-style blocks built on it: a 1-D device mesh over the
ranks (``init_device_mesh``), a feed-forward block whose first linear layer is sharded
column-wise and second row-wise (``parallelize_module`` with ``ColwiseParallel`` and
``RowwiseParallel``: their weights and gradients are DTensors, each rank holding a shard),
a LayerNorm before it left plain (replicated by hand: the same values on every rank),
AdamW over both kinds of parameter, and every rank fed the same batches (one
data-parallel replica). At the end rank 0 saves the full state dict
(``full_tensor()`` of each DTensor, as a checkpoint for serving).

Sentinel's optimizer-state record read AdamW's ``exp_avg_sq`` of the sharded weights as
DTensors next to the LayerNorm's plain ones: a UserWarning on stderr from torch, and the
first step's report failed on every rank ("probe 'report' failed"), so the history began at
step 2.

The reference: per optimizer step, the loss (the same on every rank) and the whole
model's gradient norm (each DTensor gradient gathered with ``full_tensor()``, which the
reference may do and Sentinel does not).

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import torch.distributed as dist
import zoolib
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
zoolib.env_rendezvous()  # torchrun's variables, or a world of one
dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))


def block() -> nn.Module:
    return nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))


torch.manual_seed(0)  # the same initial weights on every rank
model = parallelize_module(block(), mesh, {"1": ColwiseParallel(), "3": RowwiseParallel()})
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


gen = torch.Generator().manual_seed(1)  # the same batches on every rank
for step in range(1, steps + 1):
    x = torch.randn(16, 32, generator=gen)
    loss = (model(x) - x.flip(1)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    grads = [torch.linalg.vector_norm(full(p.grad).detach(), dtype=torch.float64) for p in model.parameters()]
    ref.step(loss, float(torch.linalg.vector_norm(torch.stack(grads))))
    optimizer.step()
    if mon is not None:
        mon.log(loss=loss)
    if rank == 0 and step % 10 == 0:
        print(f"step {step} loss {loss.item()!r}")

state = {k: full(v) for k, v in model.state_dict().items()}  # every rank takes part in the gathers
plain = block()
plain.load_state_dict(state)
if rank == 0:
    os.makedirs(out_dir, exist_ok=True)
    torch.save(state, os.path.join(out_dir, "model_full.pt"))
    ref.saved_file(os.path.join(out_dir, "model_full.pt"))
if mon is not None:
    mon.close()
dist.barrier()
dist.destroy_process_group()
ref.finish(plain)
