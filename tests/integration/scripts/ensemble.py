"""Optimizers made up front and stepped one after another on every batch, each over a model
of its own: a deep ensemble in the shape of the public PyTorch ports of Lakshminarayanan et
al. (``models`` and ``optimizers`` lists, ``for model, optimizer in zip(...)``), or a script
whose four heads' optimizers are locals of its ``main()``. No sentinel import.

Prints every member's loss every 50 steps with repr.

argv: [list|locals] [STEPS] [MEMBERS] (of the list)
"""

import sys

import torch
from torch import nn

shape = sys.argv[1] if len(sys.argv) > 1 else "list"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
members = int(sys.argv[3]) if len(sys.argv) > 3 else 5


def member() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def batches(n: int):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(8, 1, generator=gen)
    for _ in range(n):
        x = torch.randn(32, 8, generator=gen)
        yield x, x @ w + 0.1 * torch.randn(32, 1, generator=gen)


def main() -> None:
    torch.manual_seed(0)
    if shape == "list":
        models = [member() for _ in range(members)]
        optimizers = [torch.optim.Adam(m.parameters(), lr=1e-3 * (i + 1)) for i, m in enumerate(models)]
        pairs = list(zip(models, optimizers))
    else:  # four heads, each its own optimizer, held by this function's locals only
        head_a, head_b, head_c, head_d = member(), member(), member(), member()
        opt_a = torch.optim.Adam(head_a.parameters(), lr=1e-3)
        opt_b = torch.optim.Adam(head_b.parameters(), lr=2e-3)
        opt_c = torch.optim.SGD(head_c.parameters(), lr=1e-2)
        opt_d = torch.optim.RMSprop(head_d.parameters(), lr=1e-3)
        pairs = [(head_a, opt_a), (head_b, opt_b), (head_c, opt_c), (head_d, opt_d)]
    for step, (x, y) in enumerate(batches(steps)):
        losses = []
        for model, optimizer in pairs:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        if step % 50 == 0:
            print(step, [repr(v) for v in losses], flush=True)


main()
