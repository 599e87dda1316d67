"""A fine-tuning classifier in the shape of the PyTorch examples' ``mnist/main.py`` and
``imagenet/main.py``: SGD with momentum and one learning rate per param group (backbone
and head), ``StepLR`` stepped per epoch (``--sched onecycle``: ``OneCycleLR`` stepped per
batch), a backbone frozen (``requires_grad_(False)``) for the first epoch and unfrozen
after it, an evaluation pass under ``torch.no_grad()`` each epoch, the state dicts saved.

argv: OUT_DIR [--sched step|onecycle] [--epochs N]
"""

import argparse
import os

import torch
import zoolib
from models import Net
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("--sched", default="step", choices=["step", "onecycle"])
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()
torch.manual_seed(1)

images = torch.randn(96, 1, 12, 12)
labels = (images.mean(dim=(1, 2, 3)) * 40).long().clamp(-4, 5) + 4
train_loader = DataLoader(TensorDataset(images[:64], labels[:64]), batch_size=16, shuffle=True,
                          generator=torch.Generator().manual_seed(1))
test_loader = DataLoader(TensorDataset(images[64:], labels[64:]), batch_size=32)

model = Net()
for p in model.backbone.parameters():
    p.requires_grad_(False)
optimizer = torch.optim.SGD([{"params": model.backbone.parameters(), "lr": 0.01},
                             {"params": model.head.parameters(), "lr": 0.05}], lr=0.05, momentum=0.9)
if args.sched == "step":
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
else:
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[0.02, 0.1], epochs=args.epochs,
                                                    steps_per_epoch=len(train_loader))
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)

for epoch in range(1, args.epochs + 1):
    if epoch == 2:  # fine-tune the whole network from the second epoch
        for p in model.backbone.parameters():
            p.requires_grad_(True)
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        ref.step(loss, zoolib.total_norm(model.parameters()))
        optimizer.step()
        if args.sched == "onecycle":
            scheduler.step()
        if mon is not None:
            mon.log(loss=loss)
        print(f"Train Epoch: {epoch} [{batch_idx}] lr {[g['lr'] for g in optimizer.param_groups]!r} "
              f"Loss: {loss.item()!r}")
    if args.sched == "step":
        scheduler.step()
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += int(output.argmax(dim=1).eq(target).sum())
    print(f"Test set: Average loss: {test_loss / 32!r}, Accuracy: {correct}/32")

os.makedirs(args.out_dir, exist_ok=True)
torch.save({"epoch": args.epochs, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict()}, os.path.join(args.out_dir, "checkpoint.pth.tar"))
ref.saved_file(os.path.join(args.out_dir, "checkpoint.pth.tar"))
if mon is not None:
    mon.close()
ref.finish(model)
