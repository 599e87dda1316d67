"""The encoder and decoder of PyTorch's translation tutorial's shape, small: two separate
modules, which scripts put under one ``Adam(list(enc.parameters()) + list(dec.parameters()))``.
Shared by ``shapes_train.py`` (run under ``sentinel run``) and the naming unit tests."""

import torch
from torch import nn


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
