"""A small text classifier trained with re-entrant activation checkpointing, in the shape of
the Hugging Face models' ``gradient_checkpointing_enable()`` before ``use_reentrant=False``
became the default (``torch.utils.checkpoint.checkpoint(layer.__call__, hidden,
use_reentrant=True)`` per encoder layer) and of scripts that cut a ``nn.Sequential`` head
with ``checkpoint_sequential``: an embedding, 4 pre-norm encoder layers (self-attention and
a feed-forward block), mean pooling, a 3-layer head in 2 checkpointed segments,
``CrossEntropyLoss``, AdamW with weight decay off for biases and norms, 2 micro-batches
accumulated per step (``loss / 2``), ``clip_grad_norm_(…, 1.0)`` and a linear warmup.

Re-entrant checkpointing runs each layer's forward a second time inside the backward pass
and calls ``torch.autograd.backward`` from there, once per checkpointed segment per
micro-batch (6 nested calls in each of the step's 2 ``backward()`` calls); the forward hooks
of the layers run twice a micro-batch. The step's loss is still the two micro-batches'.

The reference: per optimizer step, the loss summed over the micro-batches (as the
program logs it), the gradient norm after clipping and before.

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import zoolib
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 120
torch.manual_seed(11)
gen = torch.Generator().manual_seed(11)
vocab, seq, width, classes, micro, accum = 64, 16, 32, 4, 16, 2


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 4, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        self.layers = nn.ModuleList(Layer() for _ in range(4))
        self.head = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                                  nn.Linear(width, classes))
        self.gradient_checkpointing = True

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens) + self.pos
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden = checkpoint(layer.__call__, hidden, use_reentrant=True)
            else:
                hidden = layer(hidden)
        pooled = hidden.mean(dim=1)
        if self.gradient_checkpointing and self.training:
            return checkpoint_sequential(self.head, 2, pooled, use_reentrant=True)
        return self.head(pooled)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens whose class is which quarter of the vocabulary most of them come from."""
    labels = torch.randint(0, classes, (micro,), generator=gen)
    spread = torch.randint(0, vocab // classes, (micro, seq), generator=gen)
    noise = torch.randint(0, vocab, (micro, seq), generator=gen)
    keep = torch.rand(micro, seq, generator=gen) < 0.3
    return torch.where(keep, labels[:, None] * (vocab // classes) + spread, noise), labels


model = Classifier()
decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "norm" in n]
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                               {"params": no_decay, "weight_decay": 0.0}], lr=2e-3)
warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))
loss_fn = nn.CrossEntropyLoss()
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)

model.train()
for step in range(1, steps + 1):
    total = 0.0
    for _ in range(accum):
        tokens, labels = batch()
        loss = loss_fn(model(tokens), labels) / accum
        loss.backward()
        total += loss.item()
    preclip = float(nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    ref.step(total, zoolib.total_norm(model.parameters()), preclip)
    optimizer.step()
    warmup.step()
    optimizer.zero_grad(set_to_none=True)
    if mon is not None:
        mon.log(loss=total)
    if step % 20 == 0:
        print(f"step {step} loss {total:.4f}")

model.eval()
with torch.no_grad():
    tokens, labels = batch()
    accuracy = (model(tokens).argmax(1) == labels).float().mean().item()
print(f"accuracy {accuracy:.3f}")
os.makedirs(out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(out_dir, "model.pt"))
ref.saved_file(os.path.join(out_dir, "model.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
