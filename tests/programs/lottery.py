"""Iterative magnitude pruning with rewinding, in the shape of the lottery-ticket scripts
(Frankle & Carbin's LeNet-300-100) written with ``torch.nn.utils.prune`` as the PyTorch
pruning tutorial uses it: each round trains the network with a new Adam, prunes 20 % of the
remaining weights of every layer by magnitude (``global_unstructured``), and rewinds the
surviving weights to their initial values with ``load_state_dict`` (the masks stay). At the
end the masks are made permanent (``prune.remove``) and the ticket's state dict is saved.

Each rewind takes the loss back to where an untrained network starts, by design. Judged
against the first round's best level, it paged LossDivergence (critical), LossSpike,
LossRising and LossOscillation at the first rewind.

The reference: per optimizer step, the loss and the gradient norm of the parameters the
optimizer steps (``weight_orig`` once pruned: the masked weights' gradients are 0).

argv: OUT_DIR [ITERS_PER_ROUND]
"""

import os
import sys

import torch
import zoolib
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import prune

out_dir = sys.argv[1]
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 300
rounds = 3
torch.manual_seed(0)
gen = torch.Generator().manual_seed(1)
x_all = torch.randn(4096, 64, generator=gen)
y_all = (x_all @ torch.randn(64, 10, generator=gen)).argmax(1)

model = nn.Sequential(nn.Linear(64, 300), nn.ReLU(), nn.Linear(300, 100), nn.ReLU(), nn.Linear(100, 10))
layers = [(m, "weight") for m in model if isinstance(m, nn.Linear)]
init = {k: v.clone() for k, v in model.state_dict().items()}
ref = zoolib.Reference()

for r in range(rounds):
    optimizer = torch.optim.Adam(model.parameters(), lr=1.2e-3)
    for i in range(iters):
        idx = torch.randint(0, len(x_all), (128,), generator=gen)
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        optimizer.zero_grad()
        loss.backward()
        ref.step(loss, zoolib.total_norm(model.parameters()))
        optimizer.step()
        if i % 100 == 0:
            print(f"round {r} iter {i} loss {loss.item()!r}")
    if r == rounds - 1:
        break
    prune.global_unstructured(layers, pruning_method=prune.L1Unstructured, amount=0.2)
    # rewind: the surviving weights back to their initial values, the masks kept
    state = model.state_dict()
    model.load_state_dict({k: init[k.removesuffix("_orig")] if k.endswith("_orig") else init.get(k, v)
                           for k, v in state.items()})
    alive = sum(int(m.weight_mask.sum()) for m, _ in layers)
    print(f"round {r} pruned: {alive} weights remain")

for m, name in layers:
    prune.remove(m, name)
os.makedirs(out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(out_dir, "ticket.pt"))
ref.saved_file(os.path.join(out_dir, "ticket.pt"))
ref.finish(model)
