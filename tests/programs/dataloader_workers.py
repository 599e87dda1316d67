"""A ``DataLoader`` with ``num_workers=2`` (forked workers, Linux's default), as the
imagenet example and most vision scripts run it: a ``Dataset`` whose ``__getitem__``
builds each sample from a per-index generator (so every worker yields the same batch
whatever the order), a ``worker_init_fn``, ``persistent_workers=False`` so the workers
are forked again each epoch; Adam on a small MLP.

argv: OUT_DIR [EPOCHS]
"""

import os
import sys

import torch
import zoolib
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + i)
        x = torch.randn(10, generator=g)
        return x, (x[:3].sum() > 0).float().unsqueeze(0)


def worker_init_fn(worker_id: int) -> None:
    torch.manual_seed(torch.initial_seed() % 2**31 + worker_id)


if __name__ == "__main__":
    out_dir = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.manual_seed(6)
    loader = DataLoader(Synthetic(), batch_size=12, shuffle=True, num_workers=2, worker_init_fn=worker_init_fn,
                        generator=torch.Generator().manual_seed(6))
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    criterion = nn.BCEWithLogitsLoss()
    ref = zoolib.Reference()
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            ref.step(loss, zoolib.total_norm(model.parameters()))
            optimizer.step()
            print(f"epoch {epoch} batch {i} loss {loss.item()!r}")
    os.makedirs(out_dir, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(out_dir, "model.pt"))
    ref.saved_file(os.path.join(out_dir, "model.pt"))
    ref.finish(model)
