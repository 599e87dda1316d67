"""A training script that stops itself when its loss goes bad, as public ones do; knows
nothing of Sentinel.

``deit``: the training engines of DeiT, MAE and DETR (and their copies) read the loss
before ``backward()`` and leave: ``if not math.isfinite(loss_value): print("Loss is {},
stopping training"); sys.exit(1)``. ``hydra``: ``main()`` raises, and a wrapper around it
(hydra's ``@hydra.main``, or the script's own ``try``) prints the error and calls
``sys.exit(1)``.

argv: MODE ITERATIONS BAD_AT
"""

import math
import sys
import traceback

import torch
from torch import nn

mode, iterations, bad_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    criterion = nn.CrossEntropyLoss()
    for it in range(1, iterations + 1):
        x = torch.randn(32, 16)
        out = model(x)
        if it >= bad_at:
            out = out * float("inf")  # the model's outputs overflowed
        loss = criterion(out, x[:, :4].argmax(1))
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            if mode == "hydra":
                raise FloatingPointError(f"loss is {loss_value} at iteration {it}")
            print(f"Loss is {loss_value}, stopping training", flush=True)
            sys.exit(1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("trained", flush=True)


if __name__ == "__main__":
    if mode == "hydra":
        try:
            main()
        except Exception:
            traceback.print_exc()
            sys.exit(1)
    else:
        main()
