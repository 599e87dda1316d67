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

The reference: per optimizer step, the loss and the gradient the SGD applies (the clipped,
noised mean, left in ``p.grad`` after the step).

argv: OUT_DIR [EPOCHS]
"""

import os
import sys
import warnings

import torch
import zoolib
from opacus import PrivacyEngine
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

warnings.simplefilter("ignore")  # as Opacus's tutorials do: its secure-RNG and hook warnings
out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 4
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
step = 0
for epoch in range(1, epochs + 1):
    model.train()
    losses = []
    for data, target in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        optimizer.step()
        step += 1
        ref.step(loss, zoolib.total_norm(model.parameters()))
        if mon is not None:
            mon.log(loss=loss)
        losses.append(loss.item())
    epsilon = privacy_engine.accountant.get_epsilon(delta=1e-5)
    print(f"Train Epoch: {epoch} \tLoss: {sum(losses) / len(losses)!r} (ε = {epsilon:.2f}, δ = 1e-05)")

os.makedirs(out_dir, exist_ok=True)
torch.save(model._module.state_dict(), os.path.join(out_dir, "mnist_cnn.pt"))
ref.saved_file(os.path.join(out_dir, "mnist_cnn.pt"))
if mon is not None:
    mon.close()
ref.finish(model._module)
