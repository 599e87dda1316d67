"""Hogwild training in the shape of the PyTorch examples' ``mnist_hogwild``: the parent
builds the model, calls ``model.share_memory()``, starts one ``torch.multiprocessing``
``Process`` per worker (fork) that builds its own SGD and trains the shared model, joins
them, then evaluates. The parent never steps an optimizer.

Shared weights updated by several processes at once are not bit-deterministic, so each
worker trains its own tower of the (two-tower) model, concurrently: worker ``k`` computes
its loss from tower ``k`` alone and its SGD holds tower ``k``'s parameters only; the
parent evaluates the towers' average. Every printed number is then the same on every run.

The reference: per worker (optimizer ``k``), its steps' losses and gradient norms, sent
to the parent through a queue (the workers save no file of their own).

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import torch.multiprocessing as mp
import zoolib
from torch import nn
from torch.nn import functional as F

WORKERS = 2


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Conv2d(1, 4, 3, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 5 * 5, 10))
            for _ in range(WORKERS))

    def forward(self, x: torch.Tensor, tower: int | None = None) -> torch.Tensor:
        if tower is not None:
            return F.log_softmax(self.towers[tower](x), dim=1)
        return F.log_softmax(torch.stack([t(x) for t in self.towers]).mean(0), dim=1)


def data(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 12, 12, generator=gen)
    y = (x[:, 0, :6].sum(dim=(1, 2)) > 0).long() + 2 * (x[:, 0, 6:].sum(dim=(1, 2)) > 0).long()
    return x, y


def train(rank: int, model: Net, steps: int, queue: "mp.SimpleQueue[object]") -> None:
    torch.manual_seed(1 + rank)  # as the example: args.seed + rank
    x, y = data(100 + rank, steps * 8)
    optimizer = torch.optim.SGD(model.towers[rank].parameters(), lr=0.05, momentum=0.5)
    ref = zoolib.Reference()
    model.train()
    for step in range(steps):
        batch = slice(step * 8, step * 8 + 8)
        optimizer.zero_grad()
        loss = F.nll_loss(model(x[batch], tower=rank), y[batch])
        loss.backward()
        ref.step(loss, zoolib.total_norm(model.towers[rank].parameters()))
        optimizer.step()
    queue.put((rank, ref.steps[0]))


if __name__ == "__main__":
    out_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    torch.manual_seed(1)
    mp.set_start_method("fork")
    model = Net()
    model.share_memory()  # gradients are allocated by each process: only the weights are shared
    queue = mp.get_context("fork").SimpleQueue()
    processes = []
    for rank in range(WORKERS):
        p = mp.Process(target=train, args=(rank, model, steps, queue))
        p.start()
        processes.append(p)
    got = dict(queue.get() for _ in range(WORKERS))  # before join: a full pipe would block the worker
    for p in processes:
        p.join()
        print("worker exit", p.exitcode)
    ref = zoolib.Reference(optimizers=WORKERS)
    for rank in range(WORKERS):
        ref.steps[rank] = got[rank]
        for i, s in enumerate(got[rank]):
            print(f"worker {rank} step {i} loss {s['loss']!r} grad_norm {s['grad_norm']!r}")
    x, y = data(7, 64)
    model.eval()
    with torch.no_grad():
        out = model(x)
    print("test loss", repr(F.nll_loss(out, y).item()), "correct", int((out.argmax(1) == y).sum()))
    os.makedirs(out_dir, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(out_dir, "hogwild.pt"))
    ref.saved_file(os.path.join(out_dir, "hogwild.pt"))
    ref.finish(model)
