"""A small GPT trained in the shape of Lightning-AI/litgpt's pretraining and fine-tuning
scripts (and lit-llama's before them): Lightning **Fabric**, not the Trainer. ``L.Fabric``
on the CPU, ``fabric.launch()``, ``fabric.setup(model, optimizer)`` (the optimizer comes
back as Fabric's wrapper, whose ``step()`` runs the strategy's), ``fabric.backward(loss /
ACCUM)`` under ``fabric.no_backward_sync(model, enabled=is_accumulating)``, the lr set by
hand on every param group each iteration (linear warmup, then cosine),
``fabric.clip_gradients(model, optimizer, max_norm=1.0)`` before ``optimizer.step()``, a
validation pass under ``torch.no_grad()`` every few steps, and ``fabric.save`` of a state
dict holding the wrapped model and optimizer and the iteration, loaded back by
``fabric.load`` into a fresh model and optimizer.

The reference: per optimizer step, the sum of the accumulated losses as the script scaled
them (``loss / ACCUM`` of each micro-batch), the gradient norm after clipping and before.

With ``--devices 2``: ``strategy="ddp"`` over two CPU processes, which ``fabric.launch()``
starts itself by running the script's command line again with ``LOCAL_RANK`` set (no
torchrun), and rank 0 prints and saves.

argv: OUT_DIR [STEPS] [--devices N]
"""

import argparse
import math
import os

import lightning as L
import torch
import zoolib
from models import GPT  # the zoo's nanoGPT-shaped model (litgpt's is a GPT too)
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("steps", nargs="?", type=int, default=60)
parser.add_argument("--devices", type=int, default=1)
cli = parser.parse_args()
out_dir, max_steps, devices = cli.out_dir, cli.steps, cli.devices
ACCUM, BLOCK, VOCAB, BATCH, WARMUP, LR, MIN_LR, EVAL_INTERVAL = 4, 16, 64, 8, 10, 3e-3, 3e-4, 20


def get_lr(it: int) -> float:
    if it < WARMUP:
        return LR * (it + 1) / WARMUP
    ratio = (it - WARMUP) / max(1, max_steps - WARMUP)
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * min(ratio, 1.0))) * (LR - MIN_LR)


def get_batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A text with structure: counting up by a per-row stride, modulo the vocabulary."""
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    stride = torch.randint(1, 4, (BATCH, 1), generator=gen)
    seq = (start + stride * torch.arange(BLOCK + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


fabric = L.Fabric(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", precision="32-true")
fabric.launch()
fabric.seed_everything(0, verbose=False)
model = GPT(VOCAB, BLOCK, n_layer=2, n_head=4, n_embd=32)
optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1, betas=(0.9, 0.95))
model, optimizer = fabric.setup(model, optimizer)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)

gen = torch.Generator().manual_seed(1)
val_gen = torch.Generator().manual_seed(2)
iter_num, step_count, summed = 0, 0, 0.0
while step_count < max_steps:
    for param_group in optimizer.param_groups:
        param_group["lr"] = get_lr(step_count)
    iter_num += 1
    is_accumulating = iter_num % ACCUM != 0
    input_ids, targets = get_batch(gen)
    with fabric.no_backward_sync(model, enabled=is_accumulating):
        logits, _ = model(input_ids)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        fabric.backward(loss / ACCUM)
    summed += float(loss.detach()) / ACCUM
    if mon:
        mon.log(loss=loss.detach())  # per micro-batch; the monitor averages a step's
    if not is_accumulating:
        preclip = zoolib.total_norm(model.parameters())
        fabric.clip_gradients(model, optimizer, max_norm=1.0)
        ref.step(summed, zoolib.total_norm(model.parameters()), preclip)
        optimizer.step()
        optimizer.zero_grad()
        step_count += 1
        summed = 0.0
        if step_count % EVAL_INTERVAL == 0:
            model.eval()
            with torch.no_grad():
                val = [F.cross_entropy(model(x)[0].reshape(-1, VOCAB), y.reshape(-1)) for x, y in
                       (get_batch(val_gen) for _ in range(4))]
            model.train()
            fabric.print(f"step {step_count}: loss {loss.item()!r}, val loss {float(torch.stack(val).mean())!r}")

os.makedirs(out_dir, exist_ok=True)
path = os.path.join(out_dir, "lit_model.pth")
fabric.save(path, {"model": model, "optimizer": optimizer, "iter_num": iter_num, "step_count": step_count})
fresh = GPT(VOCAB, BLOCK, n_layer=2, n_head=4, n_embd=32)
fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=LR)
fresh, fresh_opt = fabric.setup(fresh, fresh_opt)
state = {"model": fresh, "optimizer": fresh_opt, "iter_num": 0, "step_count": 0}
fabric.load(path, state)
fabric.print("loaded at step", state["step_count"], "iteration", state["iter_num"])
ref.saved_file(path)
if fabric.global_rank == 0:  # the reference is rank 0's
    ref.finish(model)
