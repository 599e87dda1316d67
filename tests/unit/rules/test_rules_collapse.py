"""``collapse`` (``TrainingCollapsed``) on synthetic series shaped as the runs it must tell
apart: a network killed mid-run, one that never learned, and healthy runs whose gradients
shrink for good reasons (a slow learner, a converged fit, a language model's pretraining)."""

from __future__ import annotations

import numpy as np

from sentinel.rules.base import Context, Verdict
from sentinel.rules.collapse import CollapseParams, detect
from sentinel.store import Window

P = CollapseParams()


def _judge(loss: np.ndarray, grad: np.ndarray, start: float | None = None, since: int = 0) -> Verdict | None:
    steps = np.arange(1, len(loss) + 1, dtype=np.int64)
    keep = slice(max(0, len(loss) - P.window), None)
    lw = Window(steps[keep], steps[keep].astype(np.float64), np.asarray(loss, dtype=np.float64)[keep])
    gw = Window(steps[keep], steps[keep].astype(np.float64), np.asarray(grad, dtype=np.float64)[keep])
    return detect(lw, P, Context(step=int(steps[-1]), now=0.0, since_step=since, reference_window=gw,
                                 loss_start=start))


def _quiet(v: Verdict | None) -> bool:
    """No firing verdict: a quiet one, or none (a loss as flat as a dead network's, with no
    fall in the window, holds an open alert and opens none)."""
    return v is None or not v.firing


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _killed(alive: int, dead: int) -> tuple[np.ndarray, np.ndarray]:
    """The convnet of ``tests/integration/scripts/dead_convnet.py`` in numbers: its loss
    falls from 2.45 to 2.15 with batches spread by 0.15, then sits at ln 10 with batches
    spread by 0.012; its gradient norm goes from 0.8 to 0.12."""
    r = _rng()
    loss = np.concatenate([np.linspace(2.45, 2.15, alive) + 0.15 * r.standard_normal(alive),
                           np.log(10) + 0.012 * r.standard_normal(dead)])
    grad = np.concatenate([0.8 * np.exp(0.3 * r.standard_normal(alive)),
                           0.12 * np.exp(0.2 * r.standard_normal(dead))])
    return loss, grad


def test_a_network_killed_mid_run_is_told_with_what_fell() -> None:
    loss, grad = _killed(200, 60)
    v = _judge(loss, grad, start=2.45)
    assert v is not None and v.firing, v
    assert v.value == np.median(loss[-50:])
    assert "flat at 2.302 (above its best 2.15, its start 2.45)" in v.detail, v.detail
    assert "gradient norm fell" in v.detail and "to 0.11" in v.detail


def test_before_it_has_been_dead_for_the_recent_window_it_is_not_told() -> None:
    loss, grad = _killed(200, 20)  # 20 dead samples among the recent 50: its level is not yet flat at ln 10
    assert _quiet(_judge(loss, grad, start=2.45))


def test_a_network_dead_longer_than_the_window_holds_its_alert_and_one_that_recovers_resolves() -> None:
    loss, grad = _killed(100, 450)  # nothing of the live part is left in the 400 samples
    assert _judge(loss, grad, start=2.45) is None  # no "before" to compare with: held, not resolved
    r = _rng()
    back = np.concatenate([loss, 2.0 + 0.15 * r.standard_normal(60)])  # it learns again
    v = _judge(back, np.concatenate([grad, 0.8 * np.ones(60)]), start=2.45)
    assert v is not None and not v.firing


def test_each_sign_alone_is_a_healthy_runs() -> None:
    loss, grad = _killed(200, 60)
    r = _rng()
    # the loss flat at chance, but its batches keep their spread: a slow learner on a hard task
    spread = np.concatenate([loss[:200], np.log(10) + 0.15 * r.standard_normal(60)])
    assert _quiet(_judge(spread, grad, start=2.45))
    # ... or its gradient keeps its size
    assert _quiet(_judge(loss, np.full(260, 0.8), start=2.45))
    # ... or the loss is at its best, not above it nor near its start
    better = np.concatenate([loss[:200], 1.2 + 0.012 * r.standard_normal(60)])
    assert _quiet(_judge(better, grad, start=2.45))


def test_a_converged_fit_with_vanishing_gradients_and_spread_is_no_collapse() -> None:
    """A regression fitted to its noise floor: its loss from 1 to 1e-4, its gradients and
    batch spread down 100x with it. Far below its start and at its best."""
    r = _rng()
    n = 400
    level = np.geomspace(1.0, 1e-4, n)
    loss = level * np.exp(0.3 * r.standard_normal(n))
    grad = np.sqrt(level) * np.exp(0.2 * r.standard_normal(n))
    v = _judge(loss, grad, start=1.0)
    assert v is not None and not v.firing


def test_a_language_models_pretraining_is_no_collapse() -> None:
    """A large batch's loss falls from 10.8 to 3.2 with a spread of 0.5 % of it, and the
    gradient norm from 8 at initialisation to 0.3: shrinking spread and gradients, a loss
    at its best."""
    r = _rng()
    n = 400
    level = 3.2 + 7.6 * np.exp(-np.arange(n) / 60.0)
    loss = level * (1.0 + 0.005 * r.standard_normal(n))
    grad = (0.3 + 7.7 * np.exp(-np.arange(n) / 30.0)) * np.exp(0.1 * r.standard_normal(n))
    assert _quiet(_judge(loss, grad, start=10.8))


def test_a_network_that_never_learned_is_told_against_its_start() -> None:
    """Dead from its first steps (the previous session's one-cycle convnet sat at ln 10
    from step 36): no best to be above, but still at its start."""
    r = _rng()
    loss = np.concatenate([2.45 + 0.2 * r.standard_normal(40), np.log(10) + 0.01 * r.standard_normal(160)])
    grad = np.concatenate([4.0 * np.exp(0.3 * r.standard_normal(40)), 0.09 * np.exp(0.2 * r.standard_normal(160))])
    v = _judge(loss, grad, start=2.45)
    assert v is not None and v.firing, v
    assert "still near its start 2.45" in v.detail, v.detail


def test_weights_set_by_the_script_start_a_new_baseline() -> None:
    """A lottery ticket's rewind takes the loss back up; what came before it is another
    training's, so the window begins there and too few samples are left for a verdict."""
    loss, grad = _killed(200, 60)
    steps = np.arange(1, 261, dtype=np.int64)
    lw = Window(steps, steps.astype(np.float64), loss)
    gw = Window(steps, steps.astype(np.float64), grad)
    assert detect(lw, P, Context(step=260, now=0.0, reference_window=gw, loss_start=2.45, rewrite_step=190)) is None


def test_a_loss_with_no_spread_before_has_none_to_lose() -> None:
    """A loss the same at every step (a full-batch fit of a frozen network's head that has
    stopped moving, a loss computed on one fixed batch) has no batch-to-batch change to
    lose: 0 is not 4× below 0, whatever its gradients do."""
    loss = np.full(260, np.log(10))
    grad = np.concatenate([np.full(200, 0.8), np.full(60, 0.1)])
    assert _quiet(_judge(loss, grad, start=float(np.log(10))))
