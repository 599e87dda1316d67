"""A Jupyter notebook, in a real IPython kernel (ipykernel, driven by jupyter_client as a
notebook front end drives it): a cell trains under ``sentinel.watch``, then the kernel
waits for the researcher's next cell. That wait is no stalled training; a cell that hangs
still is.

The stall limit is 2 s here (``min_seconds``) and a heartbeat due every 0.5 s, so the
test waits seconds, not the ten minutes of the defaults.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

jupyter_client = pytest.importorskip("jupyter_client")  # the dev extra installs it, and ipykernel

SETUP = """
import json, urllib.request
import torch
import sentinel
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
mon = sentinel.watch(model, opt, run="notebook", listen="127.0.0.1:0", config={config!r})

def stalled():
    with urllib.request.urlopen(mon.url + "/api/v1/alerts", timeout=5) as r:
        alerts = json.loads(r.read())["data"]["alerts"]
    return [a["state"] for a in alerts if a["alertname"] == "TrainingStalled"]
"""

TRAIN = """
for _ in range(30):
    x = torch.randn(32, 8)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained", mon.steps)
"""


class Kernel:
    """A real IPython kernel of this Python, with the environment given."""

    def __init__(self, env: dict[str, str]) -> None:
        self.km = jupyter_client.KernelManager(kernel_name="python3")
        self.km.kernel_spec.argv[0] = sys.executable  # this venv's Python, which has sentinel
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 120) -> str:
        """Execute one cell as a front end does; its stdout (an error fails the test)."""
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            content = msg["content"]
            if msg["msg_type"] == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(content["traceback"]))

        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        assert reply["content"]["status"] == "ok", "".join(out)
        return "".join(out)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[tuple[Kernel, str]]:
    config = tmp_path / "sentinel.yaml"
    config.write_text("rules:\n  TrainingStalled:\n    params: {min_seconds: 2}\n")
    env = {**os.environ, "SENTINEL_HEARTBEAT_SECONDS": "0.5", "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("SENTINEL_AUTO", None)
    k = Kernel(env)
    try:
        yield k, str(config)
    finally:
        k.close()


@pytest.mark.slow  # 17-41 s: behind the marker, to keep `make test` well under its 20 minutes
def test_a_kernel_waiting_for_its_next_cell_is_no_stall_and_a_hanging_cell_is(kernel: tuple[Kernel, str]) -> None:
    k, config = kernel
    k.run(textwrap.dedent(SETUP.format(config=config)))
    assert "trained 30" in k.run(TRAIN)
    time.sleep(6)  # the researcher reads the plots: three times the stall limit, no cell runs
    assert json.loads(k.run("print(json.dumps(stalled()))")) == [], "an idle kernel paged TrainingStalled"
    assert "trained 60" in k.run(TRAIN)  # the next cell trains on, from where it was
    # a cell that hangs (no step, nothing of the model) is a stall as in a script
    seen = json.loads(k.run("import time\ntime.sleep(5)\nprint(json.dumps(stalled()))"))
    assert seen == ["firing"], seen
