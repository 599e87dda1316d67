"""The common script shape: training inside ``main()``, whose model and optimizer are garbage
once it returns; then the process goes on a while (an upload, an evaluation of saved files)
and exits 0. No sentinel import. argv: SECONDS to go on after main() returned."""

import gc
import sys
import time

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(64, 8)
    for _ in range(30):
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"trained: {loss.item()!r}", flush=True)


main()
gc.collect()  # any collection: the interpreter's own, as the process goes on
time.sleep(float(sys.argv[1]))
print("done", flush=True)
