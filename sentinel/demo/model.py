"""A small GPT-like model and a synthetic next-token task, for the demo, tests and benchmarks."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer; ``layers.N`` are the blocks (the default group level).

    Args:
        vocab: vocabulary size.
        dim: model width.
        depth: number of blocks.
        heads: attention heads.
        seq: maximum sequence length.
    """

    def __init__(self, vocab: int = 256, dim: int = 64, depth: int = 2, heads: int = 4, seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.seq = seq

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), diagonal=1)
        x = self.embed(idx) + self.pos[:t]
        for layer in self.layers:
            x = layer(x, mask)
        return self.head(self.ln_f(x))


def synthetic_batch(gen: torch.Generator, batch: int, seq: int, vocab: int,
                    device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences that follow a learnable rule (each token = previous + a per-row stride),
    so the loss falls steadily. Returns inputs and next-token targets."""
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, 4, (batch, 1), generator=gen)
    ar = torch.arange(seq + 1).unsqueeze(0)
    tokens = (start + stride * ar) % vocab
    tokens = tokens.to(device)
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
