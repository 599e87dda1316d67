"""A training script that knows nothing of sentinel and then fails.

argv: steps, then what happens after them: ``kill`` (SIGKILL itself, as the OOM killer
would), ``raise`` (an exception), or ``stall`` (stop stepping for 60 s, like a hung
collective or a stuck data loader), or ``evaluate`` (a validation pass of 5 s, forward
passes under ``no_grad`` and no step, then the stall); or ``nan``: from the middle of the
steps on, the inputs are NaN.
"""

import os
import signal
import sys
import threading
import time

import torch
from engine_has import wait_for_step  # beside this script
from torch import nn

steps, fault = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)


def wait_for_peer(seconds: float) -> None:
    """A rank waiting for one that never comes (a hung collective, a stuck data loader)."""
    threading.Event().wait(seconds)


model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
for i in range(steps):
    x = torch.randn(16, 8)
    if fault == "nan" and i >= steps // 2:
        x = x * float("nan")
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.01)
print("trained", flush=True)
if fault == "kill":
    # the test checks that the crash message carries the last step's values: wait until the
    # daemon that `sentinel run` started has them (an OOM kill does not wait, of course)
    wait_for_step(os.environ["SENTINEL_URL"], steps)
    os.kill(os.getpid(), signal.SIGKILL)
elif fault == "raise":
    raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
elif fault in ("stall", "evaluate"):
    if fault == "evaluate":
        model.eval()
        end = time.monotonic() + 5
        with torch.no_grad():
            while time.monotonic() < end:
                model(torch.randn(64, 8))
                time.sleep(0.02)
        print("evaluated", flush=True)
    wait_for_peer(60)
