"""An RNN language model in the shape of the PyTorch examples' ``word_language_model``:
batchify, bptt slices, ``repackage_hidden``, ``clip_grad_norm_`` (0.25), and by default
no optimizer at all: the weights are updated by hand (``p.data.add_(p.grad, alpha=-lr)``)
after ``model.zero_grad()`` and ``backward()``, the lr divided by 4 when the loss stops
falling. ``--optimizer adamw`` steps ``torch.optim.AdamW`` instead. At the end
``torch.save(model)`` and the script's own ``torch.load`` of it, as ``main.py`` does.

The reference, per update: the loss, the norm ``clip_grad_norm_`` returned (pre-clip) and
the norm of the gradients the update applied (post-clip).

``--nan-at K`` poisons the K-th update's loss.

argv: OUT_DIR [--optimizer sgd|adamw] [--batches N] [--nan-at K]
"""

import argparse
import math
import os

import torch
import zoolib
from models import RNNModel
from torch import nn

parser = argparse.ArgumentParser(description="word-level LSTM language model")
parser.add_argument("out_dir")
parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
parser.add_argument("--lr", type=float, default=20.0)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--bptt", type=int, default=8)
parser.add_argument("--batches", type=int, default=10)
parser.add_argument("--seed", type=int, default=1111)
parser.add_argument("--nan-at", type=int, default=0, help="a NaN in the loss of this update (1-based)")
args = parser.parse_args()
torch.manual_seed(args.seed)

words = ("the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat "
         "and the dog dreams of the fox that ran away over the hill ").split() * 6
vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
ids = torch.tensor([vocab[w] for w in words], dtype=torch.long)


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):  # type: ignore[no-untyped-def]
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


train_data = batchify(ids, 4)
ntokens = len(vocab)
model = RNNModel(ntokens, 16, 16, 2, dropout=0.2, tie_weights=True)
criterion = nn.NLLLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3) if args.optimizer == "adamw" else None
ref = zoolib.Reference()
mon = None
if zoolib.watching() and optimizer is not None:
    import sentinel

    mon = sentinel.watch(model, optimizer)

lr = args.lr
best = None
model.train()
hidden = model.init_hidden(4)
done = 0
while done < args.batches:
    for i in range(0, train_data.size(0) - 1, args.bptt):
        if done == args.batches:
            break
        data, targets = get_batch(train_data, i)
        hidden = repackage_hidden(hidden)
        if optimizer is None:
            model.zero_grad()
        else:
            optimizer.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        if done + 1 == args.nan_at:  # a bad batch: log(0) somewhere upstream
            loss = loss * float("nan")
        loss.backward()
        preclip = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        ref.step(loss, zoolib.total_norm(model.parameters()), preclip=float(preclip))
        if optimizer is None:
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
        else:
            optimizer.step()
        if mon is not None:
            mon.log(loss=loss)
        done += 1
        print(f"| batch {done:3d} | lr {lr:02.2f} | loss {loss.item()!r} | ppl {math.exp(loss.item()):8.2f}")
    if best is not None and loss.item() > best:
        lr /= 4.0
    best = loss.item() if best is None else min(best, loss.item())

os.makedirs(args.out_dir, exist_ok=True)
path = os.path.join(args.out_dir, "model.pt")
with open(path, "wb") as f:
    torch.save(model, f)
ref.saved_file(path)
with open(path, "rb") as f:
    model = torch.load(f, weights_only=False)
    model.rnn.flatten_parameters()
print("reloaded", type(model).__name__)
if mon is not None:
    mon.close()
ref.finish(model)
