"""``LossDivergence`` holds until the loss comes back to the level it left: a run whose loss
jumped and stayed up must not read "resolved" once its good steps have left the rule's
window (a ReLU regression network killed by one corrupt batch sat at 800× its best level
when its critical page resolved itself, 400 steps later)."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.rules.base import Context
from sentinel.rules.divergence import DivergenceParams, detect
from sentinel.store import Window


def _frame(step: int, loss: float, t: float) -> bytes:
    return wire.encode({"kind": "step", "job": "j", "run": "dead", "rank": 0, "world": 1, "step": step, "t": t,
                        "groups": ["a"], "grad_sumsq": [1.0], "scalars": {"loss": loss}, "lr": [1e-2]})


def _divergence(engine: Engine) -> list[tuple[str, int]]:
    return [(t.state_to, t.step) for t in engine.transitions if t.alertname == "LossDivergence"]


def test_a_loss_that_jumped_and_stayed_up_keeps_its_page_until_it_comes_back() -> None:
    rnd = random.Random(3)
    engine = Engine()
    step, t = 0, 1000.0

    def train(n: int, level: Callable[[int], float]) -> None:
        """``n`` steps whose loss is ``level(step)``, each batch ±20 % off it."""
        nonlocal step, t
        for _ in range(n):
            step, t = step + 1, t + 0.1
            assert engine.feed(_frame(step, level(step) * (1 + 0.2 * rnd.uniform(-1, 1)), t))

    train(300, lambda s: 0.03 + 2.3 * 0.98 ** s)  # it learns
    train(1000, lambda s: 20.0)  # one corrupt batch later: above its start, and there for good
    # the good level left the 400-sample window 600 steps ago: still firing
    assert [s for s, _ in _divergence(engine)] == ["firing"], _divergence(engine)
    [opened] = [a for a in engine.rules.active() if a["alertname"] == "LossDivergence"]
    assert "the best level 0.0" in opened["summary"], opened["summary"]
    assert "(reached before the last 400 samples, and not since)" in opened["summary"]
    train(200, lambda s: 0.03)  # it learns again: the page resolves
    assert [s for s, _ in _divergence(engine)] == ["firing", "resolved"], _divergence(engine)


def _window(values: np.ndarray, start: int) -> Window:
    steps = np.arange(start, start + len(values), dtype=np.int64)
    return Window(steps, steps.astype(np.float64), values.astype(np.float64))


def test_the_kept_level_holds_for_one_baseline_only() -> None:
    p = DivergenceParams(window=400, recent=50, chunk=50, min_samples=100)
    r = np.random.default_rng(0)
    memo: dict[str, object] = {}
    low, high = 0.03 * (1 + 0.2 * r.uniform(-1, 1, 300)), 20.0 * (1 + 0.2 * r.uniform(-1, 1, 700))
    loss = np.concatenate([low, high])
    fired = detect(_window(loss[:400], 1), p, Context(step=400, now=0.0, memo=memo))
    assert fired is not None and fired.firing and fired.baseline < 0.04
    later = _window(loss[-400:], 601)  # nothing of the low part in the window
    assert (v := detect(later, p, Context(step=1000, now=0.0, memo=memo))) is not None and v.firing
    assert detect(later, p, Context(step=1000, now=0.0)).firing is False  # type: ignore[union-attr]  # without the kept level: resolved
    # a new baseline (a warm restart's, weights the script set): the kept level is another training's
    v = detect(later, p, Context(step=1000, now=0.0, since_step=601, memo=memo))
    assert v is not None and not v.firing and "held" not in memo
