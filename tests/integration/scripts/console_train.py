"""Train until an alert fires, then exit: for what reaches the console (stderr).

argv: ``run`` (under ``sentinel run``, no sentinel import) or ``watch`` (``sentinel.watch``
with its own engine, a child process), then the alert to wait for: ``TrainingNonFinite``
(the inputs turn NaN from step 20 on) or ``AdamWWithoutWeightDecay`` (info advice: AdamW
with ``weight_decay=0``, an otherwise clean run), or ``none`` (a clean run of 30 steps that
waits for nothing).

The script steps until the engine's ``/api/v1/alerts`` shows the alert firing (at most 60 s),
prints ``fired NAME`` and exits 0; status 3 if it never fired.
"""

import json
import os
import sys
import time
import urllib.request

import torch
from torch import nn

mode, wanted = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
if wanted == "AdamWWithoutWeightDecay":
    opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
else:
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
mon = None
if mode == "watch":
    import sentinel

    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", run="console", job="ci")
    url = str(mon.url)
else:
    url = os.environ["SENTINEL_URL"]


def fired() -> bool:
    with urllib.request.urlopen(url + "/api/v1/alerts", timeout=5) as r:
        alerts = json.load(r)["data"]["alerts"]
    return any(a["alertname"] == wanted and a["state"] == "firing" for a in alerts)


def step(i: int) -> None:
    x = torch.randn(16, 8)
    if wanted == "TrainingNonFinite" and i >= 20:
        x = x * float("nan")
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if mon is not None:
        mon.log(loss=loss)


for i in range(30):
    step(i)
status = 0
if wanted != "none":
    deadline = time.monotonic() + 60
    i = 30
    while not fired():  # a step at a time: the engine judges what the steps report
        if time.monotonic() > deadline:
            status = 3
            break
        step(i)
        i += 1
        time.sleep(0.01)
    else:
        print(f"fired {wanted}", flush=True)
if mon is not None:
    mon.close()
sys.exit(status)
