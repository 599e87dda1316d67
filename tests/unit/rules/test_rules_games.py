"""A player in a game (a GAN's generator or discriminator: its stream reports an
``objective``, not a loss) has no batch of its own to blame for a sudden change of its
gradients: they follow the other player's moves. ``GradientNoiseRising`` (``skip_games``)
warned on a healthy StyleGAN2-shaped run (tests/programs/stylegan2.py) whose generator's
gradient norm went from 0.15 to 0.98 for five steps as its discriminator pulled ahead.
Frames through the real engine, the default pack."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.rules.config import load_pack


def _frame(step: int, norm: float, value: dict[str, float]) -> bytes:
    f: dict[str, Any] = {"kind": "step", "job": "j", "run": "gan", "rank": 0, "world": 1, "step": step,
                         "t": 1000.0 + step, "groups": ["a"], "grad_sumsq": [norm * norm], "scalars": value}
    return wire.encode(f)


def _burst(name: str) -> list[str]:
    """300 steps of a gradient norm around 0.15, then five steps near 1 (and back); the
    stream's value reported as ``name``. The alerts that fired."""
    rng = np.random.default_rng(0)
    engine = Engine(pack=load_pack(), clock=lambda: 0.0)
    for step in range(1, 341):
        norm = 0.15 * math.exp(0.25 * rng.standard_normal())
        if 300 <= step < 305:
            norm = 0.95
        assert engine.feed(_frame(step, norm, {name: 0.7 + 0.05 * rng.standard_normal()}))
    return sorted({a["alertname"] for a in engine.alerts_json()} | {a["alertname"] for a in engine.rules.recent()})


@pytest.mark.parametrize("name, fires", [("loss", True), ("objective", False)])
def test_a_gradient_burst_is_a_players_move_in_a_game(name: str, fires: bool) -> None:
    fired = _burst(name)
    assert ("GradientNoiseRising" in fired) is fires, fired


def test_the_rule_skips_games_and_says_why() -> None:
    rule = load_pack().get("GradientNoiseRising")
    assert rule.skip_games and rule.severity == "warning"
