"""A character-level GPT trainer in the shape of nanoGPT's ``train.py``: micro-batches with
the loss divided before ``backward()``, a ``GradScaler`` (disabled on the CPU, as there),
``clip_grad_norm_`` after ``unscale_``, a warmup + cosine learning rate set by hand on the
param groups, AdamW with decay and no-decay groups, a tied output head; at the end
``torch.save(model)`` and a checkpoint dict, and ``torch.load`` of both.

argv: OUT_DIR [ITERS]
"""

import math
import os
import sys

import torch
import zoolib
from models import GPT

out_dir = sys.argv[1]
max_iters = int(sys.argv[2]) if len(sys.argv) > 2 else 8
gradient_accumulation_steps = 2
batch_size, block_size = 4, 16
# config/train_shakespeare_char.py's optimizer settings, with the schedule shortened
learning_rate, min_lr, warmup_iters, lr_decay_iters = 1e-3, 1e-4, 2, max_iters
weight_decay, beta1, beta2, grad_clip = 0.1, 0.9, 0.99, 1.0

torch.manual_seed(1337)
text = ("First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. "
        "First Citizen: You are all resolved rather to die than to famish? All: Resolved. resolved. ") * 4
chars = sorted(set(text))
stoi = {ch: i for i, ch in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
gen = torch.Generator().manual_seed(1337)


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=gen)
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


def get_lr(it: int) -> float:
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


model_args = dict(vocab_size=len(chars), block_size=block_size, n_layer=2, n_head=2, n_embd=32)
model = GPT(**model_args)
params = [p for p in model.parameters() if p.requires_grad]
optim_groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
optimizer = torch.optim.AdamW(optim_groups, lr=learning_rate, betas=(beta1, beta2))
scaler = torch.amp.GradScaler("cuda", enabled=False)  # float16 only; off on the CPU
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer, scaler=scaler)

X, Y = get_batch()
for iter_num in range(max_iters):
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    step_loss = 0.0
    for micro_step in range(gradient_accumulation_steps):
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch()  # prefetch, as nanoGPT does while the GPU is busy
        scaler.scale(loss).backward()
        step_loss += loss.item()
    scaler.unscale_(optimizer)
    preclip = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    ref.step(step_loss, zoolib.total_norm(model.parameters()), preclip=float(preclip))
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if mon is not None:
        mon.log(loss=step_loss)
    print(f"iter {iter_num}: loss {step_loss!r}, lr {lr!r}")

os.makedirs(out_dir, exist_ok=True)
checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "model_args": model_args,
              "iter_num": max_iters, "best_val_loss": step_loss}
torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
torch.save(model, os.path.join(out_dir, "model.pt"))
ref.saved_file(os.path.join(out_dir, "ckpt.pt"))
ref.saved_file(os.path.join(out_dir, "model.pt"))

# sample.py's way back: the checkpoint into a new model, and the whole model
ckpt = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu")
restored = GPT(**ckpt["model_args"])
restored.load_state_dict(ckpt["model"])
whole = torch.load(os.path.join(out_dir, "model.pt"), weights_only=False)
model.eval(), restored.eval(), whole.eval()
with torch.no_grad():
    probe = data[:block_size].unsqueeze(0)
    same = torch.equal(model(probe)[0], restored(probe)[0]) and torch.equal(model(probe)[0], whole(probe)[0])
print("reloaded", same, "iter", ckpt["iter_num"])
if mon is not None:
    mon.close()
ref.finish(model)
