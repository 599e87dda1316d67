"""A model under ``torch.compile``, as nanoGPT's ``compile = True`` and the PyTorch 2
tutorials use it: the module is compiled (``aot_eager`` by default, the CPU-friendly
backends; ``--backend eager`` is cheaper) and trained with AdamW; ``state_dict()`` of the
compiled wrapper is saved (its keys carry ``_orig_mod.``), and the original module's.
``--late 2``: the first two steps run eagerly and the module is compiled after them, when a
zero-code monitor is attached to it (``torch.compile`` of a watched model).
``--compile-step``: the model runs eagerly and the optimizer's step is compiled instead, as
PyTorch's compiling-optimizer recipes do (``opt.step()`` and an ``ExponentialLR``'s
``sched.step()`` in one ``torch.compile(fullgraph=False)`` function, the learning rate a
tensor so that its changes do not recompile).

argv: OUT_DIR [--backend aot_eager|eager] [--steps N] [--late K] [--compile-step]
"""

import argparse
import os

import torch
import zoolib
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("--backend", default="aot_eager")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--late", type=int, default=0)
parser.add_argument("--compile-step", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 1))
if args.compile_step:
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-2))
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, torch.tensor(0.9))
    compiled = model

    @torch.compile(fullgraph=False, backend=args.backend)
    def step_fn() -> None:
        optimizer.step()
        scheduler.step()
else:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    compiled = torch.compile(model, backend=args.backend) if not args.late else model
    step_fn = optimizer.step
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(compiled, optimizer)

gen = torch.Generator().manual_seed(0)
for step in range(args.steps):
    if args.late and step == args.late:
        compiled = torch.compile(model, backend=args.backend)
    x = torch.randn(16, 8, generator=gen)
    y = x.sin().sum(dim=1, keepdim=True)
    loss = nn.functional.mse_loss(compiled(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    ref.step(loss, zoolib.total_norm(model.parameters()))
    step_fn()
    if mon is not None:
        mon.log(loss=loss)
    print(f"step {step} loss {loss.item()!r}")

os.makedirs(args.out_dir, exist_ok=True)
torch.save(compiled.state_dict(), os.path.join(args.out_dir, "compiled_state.pt"))
torch.save(model.state_dict(), os.path.join(args.out_dir, "state.pt"))
ref.saved_file(os.path.join(args.out_dir, "compiled_state.pt"))
ref.saved_file(os.path.join(args.out_dir, "state.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
