"""DDP started by the script itself, in the shape of PyTorch's "Getting Started with
Distributed Data Parallel" tutorial and examples/distributed/ddp: ``mp.spawn(train,
args=(world_size,), nprocs=world_size, join=True)`` from ``__main__``, each process calling
``init_process_group("gloo", rank=rank, world_size=world_size)`` with ``MASTER_ADDR`` and
``MASTER_PORT`` set in the parent (no torchrun: no ``RANK``, ``LOCAL_RANK`` or
``WORLD_SIZE`` in the environment), a ``ToyModel`` wrapped in DDP, SGD, a checkpoint saved by
rank 0 and loaded by every rank after a barrier (``map_location``), then
``destroy_process_group``.

The reference: rank 0's loss and gradient norm per step; rank 0 prints the losses and the
checksum.

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import zoolib
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def train(rank: int, world_size: int, out_dir: str, steps: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    ref = zoolib.Reference()
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        outputs = model(torch.randn(20, 10, generator=gen))
        labels = torch.randn(20, 5, generator=gen)
        loss = loss_fn(outputs, labels)
        loss.backward()
        ref.step(loss, zoolib.total_norm(model.parameters()))
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item()!r}", flush=True)
    path = os.path.join(out_dir, "model.checkpoint")
    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        torch.save(model.state_dict(), path)
        ref.saved_file(path)
    dist.barrier()
    model.load_state_dict(torch.load(path, map_location={"cpu": "cpu"}, weights_only=True))
    dist.destroy_process_group()
    if rank == 0:
        ref.finish(model.module)


if __name__ == "__main__":
    out_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(zoolib.free_port())
    world_size = 2
    mp.spawn(train, args=(world_size, out_dir, steps), nprocs=world_size, join=True)
