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
from seq2seq_models import Decoder, Encoder
from torch import nn

shape, wait_file = sys.argv[1], sys.argv[2]
torch.manual_seed(0)

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
