"""Differentially private training in the shape of Opacus's ``examples/mnist.py`` and its
tutorials: the examples' ``SampleConvNet`` on 28x28 one-channel images, ``SGD`` (no
momentum), and ``PrivacyEngine().make_private(...)``, which hands back three wrappers: the
model in a ``GradSampleModule`` (hooks that keep every sample's gradient as
``p.grad_sample``), the optimizer in a ``DPOptimizer`` and the loader in a
``DPDataLoader`` (Poisson sampling: every batch has its own size). The ``DPOptimizer``'s
``step()`` clips each sample's gradient to ``max_grad_norm``, sums them, adds Gaussian
noise (``noise_multiplier * max_grad_norm``), divides by the expected batch size and
then calls the SGD's ``step()``. The script itself never clips: SGDWithoutClipping gave
DP-SGD, whose whole point is clipping, its advice to clip. Each epoch prints the privacy
spent (``accountant.get_epsilon``); the trained network's state dict (``model._module``)
is saved.

With PHYSICAL (Opacus's CIFAR-10 tutorial), the loader is read through a
``BatchMemoryManager`` that splits each Poisson batch into physical batches of at most that
many samples: every physical batch has its ``zero_grad()``, ``backward()`` and ``step()``,
and the ``DPOptimizer`` skips all but the last one's step, accumulating the clipped
per-sample gradients and dividing them by the expected batch size times the passes. A
step's loss is then the mean of its passes' losses (Sentinel reported their sum: three
times the script's loss at 24 of an expected 64).

The reference: per optimizer step, the loss (the mean of its passes') and the gradient the
SGD applies (the clipped, noised mean, left in ``p.grad`` after the step).

argv: OUT_DIR [EPOCHS [PHYSICAL]]
"""

import os
import sys
import warnings

import torch
import zoolib
from opacus import PrivacyEngine
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

warnings.simplefilter("ignore")  # as Opacus's tutorials do: its secure-RNG and hook warnings
out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 4
physical = int(sys.argv[3]) if len(sys.argv) > 3 else 0
torch.manual_seed(5)


class SampleConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 8, 2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, 4, 2)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))  # -> [B, 16, 14, 14]
        x = F.max_pool2d(x, 2, 1)  # -> [B, 16, 13, 13]
        x = F.relu(self.conv2(x))  # -> [B, 32, 5, 5]
        x = F.max_pool2d(x, 2, 1)  # -> [B, 32, 4, 4]
        x = x.view(-1, 32 * 4 * 4)
        return self.fc2(F.relu(self.fc1(x)))


# ten classes, each a blob of light at its own place on a noisy image
labels = torch.randint(0, 10, (2048,))
images = torch.randn(2048, 1, 28, 28) * 0.5
for c in range(10):
    r, col = 4 + 2 * (c // 5) * 5, 3 + 5 * (c % 5)
    images[labels == c, 0, r:r + 6, col:col + 4] += 1.5
train_loader = DataLoader(TensorDataset(images, labels), batch_size=64, shuffle=True)

model = SampleConvNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0)
privacy_engine = PrivacyEngine()
model, optimizer, train_loader = privacy_engine.make_private(
    module=model, optimizer=optimizer, data_loader=train_loader, noise_multiplier=1.0, max_grad_norm=1.0)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)
criterion = nn.CrossEntropyLoss()


def batches():
    if not physical:
        yield from train_loader
        return
    with BatchMemoryManager(data_loader=train_loader, max_physical_batch_size=physical,
                            optimizer=optimizer) as memory_safe_data_loader:
        yield from memory_safe_data_loader


step = 0
for epoch in range(1, epochs + 1):
    model.train()
    losses = []
    passes = []
    for data, target in batches():
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        passes.append(loss.detach())
        if optimizer._is_last_step_skipped:  # (the reference's: a physical batch, no step)
            continue
        step += 1
        mean = torch.stack(passes).mean()
        passes = []
        ref.step(mean, zoolib.total_norm(model.parameters()))
        if mon is not None:
            mon.log(loss=mean)
    epsilon = privacy_engine.accountant.get_epsilon(delta=1e-5)
    print(f"Train Epoch: {epoch} \tLoss: {sum(losses) / len(losses)!r} (ε = {epsilon:.2f}, δ = 1e-05)")

os.makedirs(out_dir, exist_ok=True)
torch.save(model._module.state_dict(), os.path.join(out_dir, "mnist_cnn.pt"))
ref.saved_file(os.path.join(out_dir, "mnist_cnn.pt"))
if mon is not None:
    mon.close()
ref.finish(model._module)
