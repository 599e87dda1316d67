"""A loop that skips its step when the loss is not finite, as many large-model training
scripts do (``loss.backward()``, then ``if not torch.isfinite(loss): continue``, or the
same test on the clipped norm's loss before ``optimizer.step()``). Its data go bad at a
given iteration, for one batch or for good. Knows nothing of Sentinel.

argv: ITERATIONS BAD_FROM BAD_UNTIL PAUSE_SECONDS
"""

import sys
import time

import torch
from torch import nn

iterations, bad_from, bad_until, pause = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
skipped = 0
for it in range(1, iterations + 1):
    x = torch.randn(32, 16)
    y = x.sum(dim=1, keepdim=True)
    if bad_from <= it <= bad_until:
        x[0] = float("nan")  # a corrupt sample
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    if not torch.isfinite(loss):
        skipped += 1
        print(f"iteration {it}: loss is {loss.item()}, skipping the step", flush=True)
        time.sleep(pause)
        continue
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    time.sleep(pause)
print(f"done: {iterations - skipped} steps, {skipped} skipped", flush=True)
