"""The optimizer step fused into the backward pass, in the shape of PyTorch's tutorial of
that name and torchtune's ``optimizer_in_bwd``: an AdamW per parameter
(``{p: AdamW([p]) for p in model.parameters()}``), each stepped and zeroed by the
parameter's ``register_post_accumulate_grad_hook`` as soon as its gradient is ready, so
no step is taken outside ``backward()`` and the gradients never all exist at once; the lr
(warmup, cosine) set on every optimizer by hand before each step, and a checkpoint of the
model and of every optimizer's state by parameter name.

Zero-code mode made a stream of each optimizer: 18 for a model of 9 layers, a critical
``EarlyGradientGrowth`` for one bias, and 7.7 s for 300 steps against 0.66 s unwatched.

The reference: per step, the loss and the norm of the gradients the step applies (summed
in the hooks, before each optimizer steps).

argv: OUT_DIR [STEPS]
"""

import math
import os
import sys

import torch
import zoolib
from models import GPT  # the zoo's nanoGPT-shaped model

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
BLOCK, VOCAB, BATCH, WARMUP, LR = 16, 64, 8, 10, 3e-3
torch.manual_seed(0)
model = GPT(VOCAB, BLOCK, n_layer=2, n_head=2, n_embd=32)
optim_dict = {p: torch.optim.AdamW([p], lr=LR, weight_decay=0.01, foreach=False) for p in model.parameters()}
sumsq = [0.0]


def optim_step(param: torch.Tensor) -> None:
    sumsq[0] += float(param.grad.detach().double().pow(2).sum())
    optim_dict[param].step()
    optim_dict[param].zero_grad()


for p in model.parameters():
    p.register_post_accumulate_grad_hook(optim_step)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, list(optim_dict.values()))
gen = torch.Generator().manual_seed(0)
data = torch.randint(0, VOCAB, (4096,), generator=gen)
for it in range(steps):
    lr = LR * (it + 1) / WARMUP if it < WARMUP else LR * 0.5 * (1 + math.cos(math.pi * (it - WARMUP) / steps))
    for opt in optim_dict.values():
        for group in opt.param_groups:
            group["lr"] = lr
    ix = torch.randint(len(data) - BLOCK - 1, (BATCH,), generator=gen)
    x = torch.stack([data[i:i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix])
    _, loss = model(x, y)
    sumsq[0] = 0.0
    loss.backward()  # every parameter's optimizer steps in here
    ref.step(loss, math.sqrt(sumsq[0]))
    if mon is not None:
        mon.log(loss=loss)
    if it % 20 == 0:
        print(f"iter {it} loss {loss.item()!r} lr {lr!r}")

os.makedirs(out_dir, exist_ok=True)
path = os.path.join(out_dir, "in_backward.pt")
torch.save({"model": model.state_dict(),
            "optim": {name: optim_dict[p].state_dict() for name, p in model.named_parameters()}}, path)
ref.saved_file(path)
if mon is not None:
    mon.close()
ref.finish(model)
