"""FSDP2 (fully_shard) with gloo on CPU, no sentinel import. argv: steps, the poisoned step
K, an output prefix, and ``reference`` to leave out step K's optimizer step on every rank
instead of poisoning it. At step K rank 1 alone finds a NaN in its own shard of a
gradient (after the reduce-scatter, so rank 0's shards stay finite): only a verdict every
rank shares (the guard's one all-reduce) keeps rank 0 from applying a step rank 1 skips.
Rank 0 writes the whole model's final parameters (``full_tensor()``, a collective this
script may make) to ``<prefix>.pt``."""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

steps, k, prefix = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
reference = len(sys.argv) > 4 and sys.argv[4] == "reference"
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 1))
fully_shard(model[0])
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
gen = torch.Generator().manual_seed(rank)
for i in range(1, steps + 1):
    x = torch.randn(16, 8, generator=gen)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    if i == k:
        if reference:
            continue
        if rank == 1:
            model[0].weight.grad.to_local()[0, 0] = float("nan")  # rank 1's rows of the weight only
    opt.step()
final = {n: p.full_tensor().detach() for n, p in model.named_parameters()}
if rank == 0:
    torch.save(final, f"{prefix}.pt")
dist.barrier()
dist.destroy_process_group()
