"""Monitors of one process that ask for the same engine share it (``instrument/link.py``):
a GAN's ``watch(generator, opt_g)`` and ``watch(discriminator, opt_d)``. Each started an
engine process of its own before: the discriminator's exporter on a port nobody scraped
(``127.0.0.1:9400 is in use``), both streams unlabelled, two writers of one history. Real
engine processes, real /metrics."""

from __future__ import annotations

import re
import urllib.request
from typing import Any

import torch
from torch import nn

import sentinel
from tests.helpers import wait_for


def _steps(url: str) -> dict[str, tuple[str, float]]:
    """``sentinel_step`` by ``optimizer`` label: (run, step)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.findall(r'sentinel_step\{job="train",optimizer="(\d)",rank="0",run="([^"]+)"\} (\S+)', text)
    return {opt: (run, float(step)) for opt, run, step in found}


def test_a_gans_two_watch_calls_are_two_streams_of_one_engine() -> None:
    torch.manual_seed(0)
    gen, disc = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 8)), nn.Linear(8, 1)
    opt_g, opt_d = torch.optim.Adam(gen.parameters(), 1e-3), torch.optim.SGD(disc.parameters(), 1e-3)
    seen: list[dict[str, Any]] = []
    mine: list[dict[str, Any]] = []
    # the same callback given to both, and one only the discriminator's monitor has
    mon_g = sentinel.watch(gen, opt_g, listen="127.0.0.1:0", capture_loss=True, on_alert=seen.append)
    mon_d = sentinel.watch(disc, opt_d, listen="127.0.0.1:0", capture_loss=True, on_alert=[seen.append, mine.append])
    try:
        assert mon_g.url is not None and mon_d.url == mon_g.url
        for i in range(400):  # on_alert is called at a later step, once the engine answered
            z = torch.randn(16, 4)
            opt_g.zero_grad()
            (-disc(gen(z)).mean()).backward()
            opt_g.step()
            opt_d.zero_grad()
            (disc(gen(z).detach()).mean() - disc(torch.randn(16, 8) + 1).mean()).backward()
            if i == 10:
                disc.weight.grad[0, 0] = float("inf")  # the discriminator's step goes bad, once
            opt_d.step()
            if i == 10:
                with torch.no_grad():
                    disc.weight.nan_to_num_(0.0, 0.0, 0.0)  # its weights mended: training goes on
            if i >= 30 and mine:
                break
        steps = wait_for(lambda: (s := _steps(mon_g.url)) and len(s) == 2 and s, what="both streams on /metrics")
        assert steps["0"][0] == steps["1"][0], steps  # one run
        fired = [a for a in seen if a["alertname"] == "TrainingNonFinite" and a["state_to"] == "firing"]
        assert len(fired) == 1 and fired[0]["optimizers"] == ["1"], seen  # once, for all its callbacks
        assert [a["alertname"] for a in mine if a["state_to"] == "firing"] == ["TrainingNonFinite"]
        # the generator's monitor closes; the discriminator's goes on, reported by the same engine
        mon_g.close()
        before = _steps(mon_d.url)["1"][1]
        for _ in range(5):
            opt_d.zero_grad()
            (disc(gen(torch.randn(16, 4)).detach()).mean() - disc(torch.randn(16, 8) + 1).mean()).backward()
            opt_d.step()
        wait_for(lambda: _steps(mon_d.url)["1"][1] == before + 5, what="the discriminator's later steps")
    finally:
        mon_g.close()
        mon_d.close()
    proc = mon_d.engine.proc
    assert proc.poll() is not None  # the last user's close stopped the engine process
