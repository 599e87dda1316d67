"""A detector's trainer in the shape of ultralytics/yolov5's ``train.py`` (and Ultralytics'
v8 trainer, which keeps its warmup): three param groups built by walking the modules (biases
first, with no decay; conv weights with decay scaled by the nominal batch size; BatchNorm
weights with no decay), SGD with Nesterov momentum, a warmup over max(3 epochs, 100)
batches in which every group's lr and the momentum are set by ``np.interp`` each batch (the
biases' lr falls from 0.1 while the others rise from 0), **gradient accumulation that grows
from 1 to 64 / batch size micro-batches during the warmup, on losses not divided** (the loss
is the batch's sum of box, objectness and class terms times the batch size), the
``GradScaler`` (disabled on the CPU), ``unscale_`` + ``clip_grad_norm_(10)``, a ``ModelEMA``
(a ``deepcopy`` of the model, updated in place after each step), a one-cycle ``LambdaLR``
stepped per epoch; ``torch.save`` of a checkpoint holding the EMA model whole (in half
precision) and the optimizer's state, then ``strip_optimizer``'s reload and re-save.

The loss of an optimizer step is summed over 1, then 2, ... then 8 micro-batches during the
warmup, and over fewer at an epoch's end: in the first step's units (one micro-batch), the
reference is the mean of the step's micro-batch losses (what ``mloss`` averages).

argv: OUT_DIR [EPOCHS]
"""

import copy
import math
import os
import sys

import numpy as np
import torch
import zoolib
from models import Detector
from torch import nn

out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 8
torch.manual_seed(0)


class ModelEMA:
    """yolov5's ``utils/torch_utils.py`` ModelEMA."""

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000) -> None:
        self.ema = copy.deepcopy(model).eval()
        self.updates = 0
        self.decay = lambda x: decay * (1 - math.exp(-x / tau))
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = self.decay(self.updates)
        msd = model.state_dict()
        for k, v in self.ema.state_dict().items():
            if v.dtype.is_floating_point:
                v *= d
                v += (1 - d) * msd[k].detach()


model = Detector()
g: tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]] = ([], [], [])  # smart_optimizer's walk
bn = tuple(v for k, v in nn.__dict__.items() if "Norm" in k)
for v in model.modules():
    for p_name, p in v.named_parameters(recurse=False):
        if p_name == "bias":
            g[2].append(p)
        elif p_name == "weight" and isinstance(v, bn):
            g[1].append(p)
        else:
            g[0].append(p)
hyp = {"lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 5e-4, "warmup_epochs": 3.0,
       "warmup_momentum": 0.8, "warmup_bias_lr": 0.1, "box": 0.05, "obj": 1.0, "cls": 0.5}
batch_size, nbs, nb = 8, 64, 40
optimizer = torch.optim.SGD(g[2], lr=hyp["lr0"], momentum=hyp["momentum"], nesterov=True)
optimizer.add_param_group({"params": g[0], "weight_decay": hyp["weight_decay"] * batch_size * max(round(nbs / batch_size), 1) / nbs})
optimizer.add_param_group({"params": g[1], "weight_decay": 0.0})


def lf(x: float) -> float:  # one_cycle(1, lrf, epochs)
    return ((1 - math.cos(x * math.pi / epochs)) / 2) * (hyp["lrf"] - 1) + 1


scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
ema = ModelEMA(model)
scaler = torch.amp.GradScaler("cpu", enabled=False)
gen = torch.Generator().manual_seed(0)
images, targets = torch.randn(nb * batch_size, 3, 32, 32, generator=gen), torch.randn(nb * batch_size, 8, 4, 4, generator=gen)
ref = zoolib.Reference()

nw = max(round(hyp["warmup_epochs"] * nb), 100)  # warmup iterations
accumulate = max(round(nbs / batch_size), 1)
last_opt_step = -1
micro: list[float] = []  # this step's micro-batch losses, for the reference
for epoch in range(epochs):
    model.train()
    mloss = 0.0
    optimizer.zero_grad()
    micro.clear()  # the last epoch's unstepped micro-batches: zeroed, as yolov5 does
    for i in range(nb):
        ni = i + nb * epoch
        imgs, tgt = images[i * batch_size:(i + 1) * batch_size], targets[i * batch_size:(i + 1) * batch_size]
        if ni <= nw:
            xi = [0, nw]
            accumulate = max(1, int(np.interp(ni, xi, [1, nbs / batch_size]).round()))
            for j, x in enumerate(optimizer.param_groups):
                x["lr"] = float(np.interp(ni, xi, [hyp["warmup_bias_lr"] if j == 0 else 0.0,
                                                   x["initial_lr"] * lf(epoch)]))
                if "momentum" in x:
                    x["momentum"] = float(np.interp(ni, xi, [hyp["warmup_momentum"], hyp["momentum"]]))
        pred = model(imgs)
        lbox = (pred[:, :4] - tgt[:, :4]).pow(2).mean()
        lobj = nn.functional.binary_cross_entropy_with_logits(pred[:, 4], (tgt[:, 4] > 0).float())
        lcls = nn.functional.cross_entropy(pred[:, 5:], tgt[:, 5:].argmax(1))
        loss = (hyp["box"] * lbox + hyp["obj"] * lobj + hyp["cls"] * lcls) * batch_size  # loss * bs
        scaler.scale(loss).backward()
        micro.append(loss.item())
        if ni - last_opt_step >= accumulate:
            scaler.unscale_(optimizer)
            preclip = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            ref.step(sum(micro) / len(micro), zoolib.total_norm(model.parameters()), preclip=float(preclip))
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            ema.update(model)
            last_opt_step = ni
            micro.clear()
        mloss = (mloss * i + loss.item()) / (i + 1)
    scheduler.step()
    print(f"epoch {epoch} mloss {mloss!r} accumulate {accumulate} lr {[x['lr'] for x in optimizer.param_groups]!r}")

os.makedirs(out_dir, exist_ok=True)
last = os.path.join(out_dir, "last.pt")
torch.save({"epoch": epoch, "best_fitness": None, "model": None, "ema": copy.deepcopy(ema.ema).half(),
            "updates": ema.updates, "optimizer": optimizer.state_dict()}, last)
x = torch.load(last, map_location="cpu", weights_only=False)  # strip_optimizer
x["model"] = x.pop("ema")
x["optimizer"], x["updates"], x["epoch"] = None, None, -1
for p in x["model"].parameters():
    p.requires_grad = False
stripped = os.path.join(out_dir, "best.pt")
torch.save(x, stripped)
ref.saved_file(last)
ref.saved_file(stripped)
ref.finish(model)
