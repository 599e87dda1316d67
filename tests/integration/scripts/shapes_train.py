"""Two program shapes of the README's table, knowing nothing of sentinel. argv: the shape,
then a file to wait for before exiting.

- ``seq2seq``: PyTorch's translation tutorial's shape, an encoder and a decoder, separate
  modules, under one ``Adam(list(enc.parameters()) + list(dec.parameters()))``.
- ``maximize``: a log-likelihood maximized as it is (``Adam(maximize=True)``); prints each
  step's value.
"""

import os
import sys
import time

import torch
from torch import nn

shape, wait_file = sys.argv[1], sys.argv[2]
torch.manual_seed(0)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.rnn = nn.GRU(8, 16, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(self.emb(x))[1]


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.rnn = nn.GRU(8, 16, batch_first=True)
        self.out = nn.Linear(16, 20)

    def forward(self, y: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.emb(y), h)[0])


if shape == "seq2seq":
    enc, dec = Encoder(), Decoder()
    opt = torch.optim.Adam(list(enc.parameters()) + list(dec.parameters()), lr=1e-3)
    for _ in range(10):
        y = torch.randint(0, 20, (4, 5))
        logits = dec(y, enc(torch.randint(0, 20, (4, 6))))
        loss = nn.functional.cross_entropy(logits.reshape(-1, 20), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
else:
    mu = nn.Parameter(torch.zeros(4))
    opt = torch.optim.Adam([mu], lr=0.05, maximize=True)
    target = torch.tensor([1.0, -2.0, 0.5, 3.0])
    for _ in range(10):
        ll = -((mu - target) ** 2).sum()
        print(repr(float(ll.detach())), flush=True)
        opt.zero_grad()
        ll.backward()
        opt.step()
print("trained", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(wait_file) and time.monotonic() < deadline:
    time.sleep(0.05)
