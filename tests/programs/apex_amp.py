"""Mixed precision with a loss scaler of the script's own, as NVIDIA apex's amp (O1) wrote it
and many public repositories still run it (fairseq's ``DynamicLossScaler`` and DeepSpeed's
fp16 engine work the same way): the forward pass in float16 (here ``torch.autocast`` on the
CPU, as amp's O1 patches the functions), the weights float32, and ``with
amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()``. The scaler
multiplies the loss by a power of two (2**16 to start, a Python float) before
``backward()``; on leaving the block it unscales the gradients in place and looks for an
overflow. An overflow halves the scale and makes the next ``optimizer.step()`` a no-op (amp
puts a skipping function on the optimizer object for one call, and prints that it skips);
every ``SCALE_WINDOW`` clean steps double the scale. Then ``clip_grad_norm_`` on the
unscaled gradients (inf at an overflow), AdamW, ``zero_grad()`` at the top of the loop.

The scale climbs until float16's range overflows in the backward pass, a few times in the
run: the loss a script logs is the unscaled one, and an overflow's skipped step is no fault.

argv: OUT_DIR [STEPS]
"""

import contextlib
import math
import os
import sys
from collections.abc import Iterator

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 240
SCALE_WINDOW = 25
torch.manual_seed(5)


class LossScaler:
    """apex's dynamic ``LossScaler``, in short: a Python float, doubled after
    ``SCALE_WINDOW`` clean steps, halved at an overflow."""

    def __init__(self, scale: float = 2.0 ** 16) -> None:
        self.scale = scale
        self.clean = 0
        self.overflow = False

    def unscale(self, params: list[nn.Parameter]) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        for g in grads:
            g.mul_(1.0 / self.scale)
        self.overflow = not all(bool(torch.isfinite(g).all()) for g in grads)

    def update(self) -> None:
        if self.overflow:
            self.scale /= 2.0
            self.clean = 0
            return
        self.clean += 1
        if self.clean % SCALE_WINDOW == 0:
            self.scale *= 2.0


scaler = LossScaler()


@contextlib.contextmanager
def scale_loss(loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """amp's ``scale_loss``: the scaled loss to call ``backward()`` on, then the gradients
    unscaled and the step skipped if they overflowed."""
    yield loss.float() * scaler.scale
    params = [p for group in optimizer.param_groups for p in group["params"]]
    scaler.unscale(params)
    if scaler.overflow:
        opt_step = optimizer.step

        def skip_step(*args: object, **kwargs: object) -> None:
            print(f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {scaler.scale}")
            optimizer.step = opt_step  # type: ignore[method-assign]

        optimizer.step = skip_step  # type: ignore[method-assign]
    scaler.update()


model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)

gen = torch.Generator().manual_seed(5)
data = torch.randn(4096, 32, generator=gen)
labels = (data[:, :10] + 0.5 * data[:, 10:20]).argmax(dim=1)
overflows = 0
for step in range(steps):
    idx = torch.randint(0, len(data), (128,), generator=gen)
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        logits = model(data[idx])
    loss = nn.functional.cross_entropy(logits.float(), labels[idx])
    with scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    skipped = scaler.overflow
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if skipped:
        overflows += 1
    else:
        ref.step(loss, zoolib.total_norm(model.parameters()), float(norm))
    optimizer.step()  # a no-op after an overflow: amp's skip_step
    if mon is not None and not skipped:
        mon.log(loss=loss)
    print(f"step {step} loss {loss.item()!r} scale {scaler.scale!r}")

assert overflows >= 2 and math.isfinite(scaler.scale), (overflows, scaler.scale)  # the scaler was exercised
ref.extra["overflows"] = overflows
os.makedirs(out_dir, exist_ok=True)
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": {"scale": scaler.scale}},
           os.path.join(out_dir, "checkpoint.pt"))
ref.saved_file(os.path.join(out_dir, "checkpoint.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
