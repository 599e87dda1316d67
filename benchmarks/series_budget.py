"""Series per node: what one daemon exports for 1 and 8 ranks x 8 and 64 groups, in the
``full`` and the ``fleet`` profile (sentinel/serve/profile.py), and the arithmetic for a
thousand nodes.

The frames are those of a real run recorded by the monitor itself (an MLP of G-1 blocks
and a head, AdamW, 300 steps: gradients every step, parameter norms, updates and the SNR
at the monitor's cadence, optimizer state every 100 steps), replayed as R ranks of one DDP
job into a real engine; the series are counted in what the exporter's collector yields
at a scrape, the engine's own health series included. No alert names a group (the model
is residual and healthy).

Nothing here asserts: it prints a table and exits 0. ``python benchmarks/series_budget.py``
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sentinel import wire  # noqa: E402
from sentinel.engine.engine import Engine  # noqa: E402
from sentinel.instrument.monitor import Monitor  # noqa: E402
from sentinel.instrument.options import from_kwargs  # noqa: E402
from sentinel.serve.exporter import StoreCollector  # noqa: E402
from sentinel.serve.profile import profile_filter  # noqa: E402

STEPS = 300
NODES = 1000


class _Recorder:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.dropped = 0

    def send(self, data: bytes) -> bool:
        self.frames.append(wire.decode(data))
        return True

    def close(self) -> None:
        pass


class Net(nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(groups - 1))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)  # residual: a healthy deep model, no alert names a group
        return self.head(x)


def record(groups: int) -> tuple[list[dict[str, Any]], int]:
    torch.manual_seed(0)
    model = Net(groups)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = _Recorder()
    mon = Monitor(model, [opt], from_kwargs({"engine": "off", "run": "budget"}), sender=rec)
    for _ in range(STEPS):
        x = torch.randn(16, 8)
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        mon.log(loss=loss)
    n = len(mon.groups)
    mon.close()
    return [f for f in rec.frames if f["kind"] in ("step", "log")], n


def count(frames: list[dict[str, Any]], ranks: int, profile: str) -> int:
    engine = Engine()
    for f in frames:
        for r in range(ranks):
            g = dict(f, rank=r, world=ranks, t=time.time())
            g.pop("v", None)
            engine.feed(wire.encode(g))
    collector = StoreCollector(engine.store, extra=engine.health_rows,
                               select=profile_filter(profile, engine.rules.active))
    active = engine.rules.active()
    assert not [a for a in active if a.get("groups")], [a["alertname"] for a in active]
    return sum(len(m.samples) for m in collector.collect())


def main() -> int:
    rows = []
    for groups in (8, 64):
        frames, formed = record(groups)
        for ranks in (1, 8):
            full, fleet = count(frames, ranks, "full"), count(frames, ranks, "fleet")
            rows.append((ranks, formed, full, fleet))
    print("| ranks | groups | series, full | series, fleet | 1,000 nodes, full | 1,000 nodes, fleet |")
    print("|---:|---:|---:|---:|---:|---:|")
    for ranks, groups, full, fleet in rows:
        print(f"| {ranks} | {groups} | {full:,} | {fleet:,} | {full * NODES / 1e6:.2f} M | {fleet * NODES / 1e6:.2f} M |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
