"""FSDP2 (fully_shard) with gloo on CPU, no sentinel import. argv: steps, a JSON file for the
unsharded reference norms (written by rank 0), a file to wait for before exiting.

The reference is taken from the full gradients and parameters (``full_tensor()``, a
collective this script may make; sentinel makes none)."""

import json
import math
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

steps, ref_file, wait_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
pace = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0  # seconds a step at least, for a scraper to see it
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # 5 rows over 2 ranks shard 3 + 2; the head's single row leaves rank 1 an empty shard
        self.layers = nn.ModuleList([nn.Linear(8, 5), nn.Linear(5, 7)])
        self.head = nn.Linear(7, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


model = Net()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
gen = torch.Generator().manual_seed(rank)


def full(t: Any) -> torch.Tensor:
    """The whole tensor of a DTensor: an all-gather (the reference may; sentinel does not)."""
    return t.full_tensor()


def sumsq_by_group(tensors: dict[str, torch.Tensor]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, t in tensors.items():
        group = name.rsplit(".", 1)[0]  # layers.0.weight -> layers.0, head.bias -> head
        out[group] = out.get(group, 0.0) + float(t.double().square().sum())
    return out


reference = []
for i in range(steps):
    x = torch.randn(16, 8, generator=gen)
    loss = nn.functional.mse_loss(model(x), 3 * x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    max_norm = 2.0 if i + 1 < steps else 1e6  # clip every step but the last (it shows the raw norm)
    preclip = float(full(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
    grads = sumsq_by_group({n: full(p.grad) for n, p in model.named_parameters()})
    opt.step()
    params = sumsq_by_group({n: full(p) for n, p in model.named_parameters()})
    reference.append({"step": i + 1, "preclip": preclip,
                      "grad_norm": math.sqrt(sum(grads.values())),
                      "group_grad_norm": {g: math.sqrt(v) for g, v in grads.items()},
                      "param_norm": math.sqrt(sum(params.values()))})
    time.sleep(pace)


def local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


# what this rank holds: its shards of the optimizer state and of the parameters
held = {"state": {}, "params": sum(local_bytes(p) for p in model.parameters())}
for st in opt.state.values():
    for key, val in st.items():
        if key != "step":
            held["state"][key] = held["state"].get(key, 0) + local_bytes(val)
with open(f"{ref_file}.rank{rank}.tmp", "w") as fh:
    json.dump(held, fh)
os.replace(f"{ref_file}.rank{rank}.tmp", f"{ref_file}.rank{rank}")
if rank == 0:
    with open(ref_file + ".tmp", "w") as fh:
        json.dump(reference, fh)
    os.replace(ref_file + ".tmp", ref_file)
print(f"rank {rank} trained", flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(wait_file) and time.monotonic() < deadline:
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
