"""A small BatchNorm convnet trained by SGD with momentum under ``OneCycleLR``, as CIFAR
and MNIST scripts write it, on a 10-class task hard enough to learn slowly (class
templates under heavy noise). Its one-cycle peak decides its fate: at ``max_lr`` 0.6 the
network learns (its loss falls from 2.5 to 1.6 by step 100), then dies past the peak
(step 180) and sits at ln 10 = 2.30 for the rest of the run with its gradient norm 8 times
down; at 0.05 it trains to 1.4.

Such a run is chaotic: the last bits of each sum decide whether the peak kills it. At
``max_lr`` 0.4 (and noise 6) it died on the Intel Xeon hosts and trained on an AMD EPYC.
So the script computes the same way on any x86 CPU: ATen's AVX2 kernels, MKL's
reproducible path (``MKL_CBWR``), one thread, and no oneDNN (whose blocking follows the
cache sizes).

argv: MAX_LR [STEPS]
"""

import os
import sys

os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")  # read when torch loads
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)
torch.backends.mkldnn.enabled = False
max_lr = float(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 600
templates = torch.randn(10, 1, 16, 16)
model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(32 * 16, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=max_lr, momentum=0.9, weight_decay=5e-4)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=max_lr, total_steps=steps)
for step in range(steps):
    y = torch.randint(0, 10, (64,))
    x = templates[y] + 4.0 * torch.randn(64, 1, 16, 16)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    if step % 100 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
print("done")
