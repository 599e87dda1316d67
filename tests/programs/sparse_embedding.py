"""Sparse embeddings in the shape of word2vec and recommendation scripts (the
``nn.Embedding(sparse=True)`` + ``torch.optim.SparseAdam`` pattern of PyTorch's docs,
DLRM, torch-based word2vec repos): user and item tables with sparse gradients, trained by
SparseAdam, and a dense scoring head trained by Adam, both stepped after one
``backward()``. With ``ZOO_WATCH=1`` one ``sentinel.watch`` gets both optimizers.

The reference: per optimizer, the step's loss and the norm of the gradient it applies;
for the tables, taken from the coalesced sparse gradients (duplicate indices in a batch
add up: the norm of ``grad.coalesce().values()``, not of the raw values).

argv: OUT_DIR [STEPS]
"""

import math
import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 16
users, items, dim, batch = 50, 80, 8, 32
torch.manual_seed(3)


class Recommender(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.user = nn.Embedding(users, dim, sparse=True)
        self.item = nn.Embedding(items, dim, sparse=True)
        self.head = nn.Sequential(nn.Linear(2 * dim, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.user(u), self.item(i)], dim=1)).squeeze(1)


def sparse_norm(params: list[torch.Tensor]) -> float:
    sq = 0.0
    for p in params:
        g = p.grad
        if g is None:
            continue
        values = g.coalesce().values() if g.is_sparse else g
        sq += float(torch.linalg.vector_norm(values, dtype=torch.float64)) ** 2
    return math.sqrt(sq)


model = Recommender()
sparse_params = [model.user.weight, model.item.weight]
sparse_opt = torch.optim.SparseAdam(sparse_params, lr=0.05)
dense_opt = torch.optim.Adam(model.head.parameters(), lr=0.01)
ref = zoolib.Reference(optimizers=2)
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, [sparse_opt, dense_opt])
gen = torch.Generator().manual_seed(4)
taste = torch.randn(users, generator=gen)
kind = torch.randn(items, generator=gen)
loss_fn = nn.BCEWithLogitsLoss()
for step in range(steps):
    u = torch.randint(0, users, (batch,), generator=gen)  # repeats within a batch: uncoalesced grads
    i = torch.randint(0, items, (batch,), generator=gen)
    y = (taste[u] * kind[i] > 0).float()
    loss = loss_fn(model(u, i), y)
    sparse_opt.zero_grad()
    dense_opt.zero_grad()
    loss.backward()
    assert model.user.weight.grad is not None and model.user.weight.grad.is_sparse
    ref.step(loss, sparse_norm(sparse_params), optimizer=0)
    ref.step(loss, zoolib.total_norm(model.head.parameters()), optimizer=1)
    sparse_opt.step()
    dense_opt.step()
    if mon is not None:
        mon.log(loss=loss)
    print(f"step {step} loss {loss.item()!r}")

with torch.no_grad():
    u = torch.arange(users).repeat_interleave(2)[:batch]
    print("scores", repr(float(model(u, u % items).sum())))
os.makedirs(out_dir, exist_ok=True)
path = os.path.join(out_dir, "recommender.pt")
torch.save({"model": model.state_dict(), "sparse_opt": sparse_opt.state_dict(),
            "dense_opt": dense_opt.state_dict()}, path)
ref.saved_file(path)
if mon is not None:
    mon.close()
ref.finish(model)
