"""A script that starts ``multiprocessing`` pools before training, as preprocessing
scripts (tokenizers, nanoGPT's ``prepare.py`` through ``datasets.map(num_proc=...)``) do:
a spawned pool (fresh Pythons that import this file as ``__mp_main__``; torch is imported
under the ``__main__`` guard, so they stay light) featurizes the data in pure Python, a
forked pool (Linux's default; the children hold torch and Sentinel's hooks, if any) checks
it with torch, then the parent trains with SGD.

argv: OUT_DIR [STEPS]
"""

import multiprocessing as mp
import os
import random
import sys


def featurize(i: int) -> list[float]:
    rng = random.Random(i)
    x = [rng.gauss(0.0, 1.0) for _ in range(6)]
    return x + [v * v for v in x]


def row_norm(row: list[float]) -> float:
    import torch

    return round(float(torch.tensor(row).norm()), 6)


if __name__ == "__main__":
    import torch
    import zoolib
    from torch import nn

    out_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    with mp.get_context("spawn").Pool(2) as pool:
        rows = pool.map(featurize, range(64))
    with mp.get_context("fork").Pool(2) as pool:
        norms = pool.map(row_norm, rows)
    print("featurized", len(rows), "rows, norm sum", repr(round(sum(norms), 4)))
    torch.manual_seed(7)
    data = torch.tensor(rows)
    target = data[:, :6].sum(dim=1, keepdim=True)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ref = zoolib.Reference()
    for step in range(steps):
        batch = slice((step * 8) % 64, (step * 8) % 64 + 8)
        loss = nn.functional.mse_loss(model(data[batch]), target[batch])
        optimizer.zero_grad()
        loss.backward()
        ref.step(loss, zoolib.total_norm(model.parameters()))
        optimizer.step()
        print(f"step {step} loss {loss.item()!r}")
    with mp.get_context("fork").Pool(1) as pool:  # after training: the children inherit the monitor, if any
        print("after", pool.map(row_norm, rows[:2]))
    os.makedirs(out_dir, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(out_dir, "model.pt"))
    ref.saved_file(os.path.join(out_dir, "model.pt"))
    ref.finish(model)
