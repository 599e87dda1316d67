"""The early-training detector (rules/early.py) and the first steps in the rule engine."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sentinel.rules import RuleEngine, load_pack
from sentinel.rules.base import Context
from sentinel.rules.early import EarlyParams, detect
from sentinel.store import Store, Window, labels_of


def win(values: list[float], start: int = 1) -> Window:
    v = np.asarray(values, dtype=np.float64)
    steps = np.arange(start, start + len(v), dtype=np.int64)
    return Window(steps, steps.astype(np.float64), v)


def verdict(values: list[float], step: int | None = None, **params: Any) -> bool | None:
    w = win(values)
    v = detect(w, EarlyParams(**params), Context(step=int(w.steps[-1]) if step is None else step, now=0.0))
    return None if v is None else v.firing


FALLING = [2.0 * 0.95**i for i in range(60)]
SWINGING = [2.0, 0.1, 1.5, 0.09, 1.2, 0.3, 1.4, 0.5, 0.6, 0.7]


@pytest.mark.parametrize(
    ("values", "params", "fires"),
    [
        (FALLING, {"check": "jumps"}, False),  # falling fast is healthy
        (SWINGING, {"check": "jumps"}, True),  # 0.1 → 1.5, 0.09 → 1.2, 0.3 → 1.4
        ([1.0, 0.2, 1.0, 0.9, 0.8], {"check": "jumps"}, False),  # one noisy batch
        ([0.05, 0.2, 0.15, 0.3, 0.5], {"check": "above", "value": 0.1, "count": 3}, True),
        ([0.05, 0.2, 0.05, 0.3, 0.05], {"check": "above", "value": 0.1, "count": 3}, False),
        ([1.0 * 1.5**i for i in range(10)], {"check": "growth", "count": 8, "factor": 10.0}, True),
        ([1.0, 2, 1, 2, 1, 2, 1, 2, 1, 2], {"check": "growth", "count": 8, "factor": 10.0}, False),
        ([1.0 + 0.001 * i for i in range(10)], {"check": "growth", "count": 8, "factor": 10.0}, False),  # slow creep
        # an explosion that speeds up: the last rise is 5× of its 85×
        ([1.0, 1.0, 1.1, 1.21, 1.45, 1.89, 2.83, 5.66, 17.0, 85.0], {"check": "growth", "count": 8, "factor": 10.0},
         True),
        # a creep of 1.5× and then one 17× jump (StyleGAN2's lazy R1 step): a spike's, not growth
        ([0.6, 0.538, 0.555, 0.592, 0.66, 0.723, 0.741, 0.757, 0.787, 13.454],
         {"check": "growth", "count": 8, "factor": 10.0}, False),
        ([1.0] * 10 + [1.5] * 45, {"check": "rise", "at_step": 50, "chunk": 10, "factor": 1.3}, True),
        (FALLING, {"check": "rise", "at_step": 50, "chunk": 10, "factor": 1.3}, False),
        ([1.386] * 55, {"check": "stall", "at_step": 50, "chunk": 10}, True),
        ([1.386] * 10 + [1.35] * 45, {"check": "stall", "at_step": 50, "chunk": 10}, False),  # 2.6 % lower
    ],
)
def test_early_checks(values: list[float], params: dict[str, Any], fires: bool) -> None:
    assert verdict(values, **params) is fires


def test_level_checks_wait_for_their_step() -> None:
    assert verdict([1.386] * 30, check="stall", at_step=50, chunk=10) is None


def test_after_the_early_phase_the_verdict_is_ok() -> None:
    # an alert raised in the first steps resolves once they are over
    assert verdict(SWINGING, step=101, check="jumps", until=100) is False


def test_samples_after_until_are_not_judged() -> None:
    late = [1.0] * 20 + [0.1, 1.0, 0.1, 1.0, 0.1, 1.0]  # swings at steps 21..26
    assert verdict(late, step=20, check="jumps", until=20) is False


def _engine() -> tuple[RuleEngine, Store]:
    store = Store()
    return RuleEngine(load_pack(), store, clock=lambda: 0.0), store


def test_loss_swinging_from_step_one_is_reported_in_the_first_steps() -> None:
    eng, store = _engine()
    labels = labels_of(job="j", run="r", rank=0)
    fired = []
    for step, loss in enumerate(SWINGING, 1):
        store.add("sentinel_loss", labels, step, float(step), loss)
        fired += [t for t in eng.evaluate("j", "r", 0, step, float(step)) if t.state_to == "firing"]
    assert [(t.alertname, t.severity) for t in fired] == [("EarlyLossSwing", "info")]
    assert fired[0].step <= 7


def test_early_rules_are_not_evaluated_after_their_phase() -> None:
    eng, store = _engine()
    labels = labels_of(job="j", run="r", rank=0)
    for step in range(1, 160):
        loss = 2.0 * 0.99**step if step <= 100 else SWINGING[step % len(SWINGING)]  # swings only late
        store.add("sentinel_loss", labels, step, float(step), loss)
        out = eng.evaluate("j", "r", 0, step, float(step))
        assert not [t for t in out if t.alertname.startswith("Early") and t.state_to == "firing"], step


def test_a_noisy_flat_loss_is_not_called_stalled() -> None:
    # 8 % batch noise: two medians of 10 batches cannot tell a 1 % fall from none
    rng = np.random.default_rng(0)
    noisy = list(2.0 * np.exp(-np.arange(55) / 400) * (1 + 0.08 * rng.standard_normal(55)))
    assert verdict(noisy, check="stall", at_step=50, chunk=10) is None


def test_a_noisy_loss_near_its_floor_is_no_swing() -> None:
    # a small-batch MSE that fell from ~7 to ~0.1 jumps 3-10× between batches, far below its start
    floor = [3.4, 12.5, 6.9, 5.5, 3.9, 2.7, 0.9, 0.4, 0.3, 0.9, 0.2, 2.1, 0.2, 0.8, 0.1, 0.6, 0.04, 0.4, 0.06, 0.44]
    assert verdict(floor, check="jumps", rebound=0.5) is False
    assert verdict(SWINGING, check="jumps", rebound=0.5) is True  # 1.5 and 1.2 and 1.4 are near the start of 2


def test_a_training_watched_from_its_middle_has_no_first_steps_to_swing_in() -> None:
    """Reptile's fine-tune, watched once it had trained for a while (its steps go on from
    Adam's count, here from 61): its first watched losses are near its floor, no start, and
    their batch-to-batch swings paged EarlyLossSwing in runs whose watch began late enough. The same losses
    from step 1 are judged as before."""
    assert verdict(SWINGING, check="jumps", rebound=0.5) is True
    assert verdict_from(SWINGING, 61, check="jumps", rebound=0.5) is None
    assert verdict_from(SWINGING, 3, check="jumps", rebound=0.5) is True  # a first step or two unseen
    # the other checks against the start too: a 3× rise from step 1, none from the middle
    rising = [1.0] * 10 + [3.5] * 20
    assert verdict_from(rising, 1, check="rise", factor=3.0, chunk=5, at_step=20) is True
    assert verdict_from(rising, 41, check="rise", factor=3.0, chunk=5, at_step=20) is None


def verdict_from(values: list[float], start: int, **params: Any) -> bool | None:
    out = detect(win(values, start), EarlyParams(**params), Context(step=start + len(values) - 1, now=0.0))
    return None if out is None else out.firing


def _signed(level: float, sigma: float, n: int, seed: int) -> list[float]:
    return list(level + sigma * np.random.default_rng(seed).standard_normal(n))


@pytest.mark.parametrize(
    ("values", "fires"),
    [
        # a loss whose 0 means nothing (PPO's surrogate + value loss - entropy bonus): a step
        # from 0.003 to 0.012 is no "4× jump" (tests/programs/ppo.py had 3 such by step 99)
        (_signed(0.0, 0.01, 100, 1), None),
        (_signed(0.005, 0.01, 100, 2), None),
        ([0.02, 0.021, 0.019, 0.003, 0.012, -0.004, 0.001, 0.011, 0.002, 0.015], None),
        # a negative ELBO: positive, then through 0
        (list(np.linspace(9.0, -1.0, 100)), None),
        # positive losses keep the check
        (SWINGING, True),
        (FALLING, False),
    ],
)
def test_jumps_are_not_judged_on_a_loss_that_crosses_zero(values: list[float], fires: bool | None) -> None:
    assert verdict(values, check="jumps", rebound=0.5, factor=3.0, count=3) is fires


def test_weights_the_script_set_end_the_samples_judged_before_them() -> None:
    """Lightning's batch-size finder: a few steps per trial, the initial weights restored,
    then the fit, whose losses start high again. Against the trials' first losses its
    level at step 65 is a rise; from the restore on (``rewrite_step``) it is a fall."""
    trials = [10.0, 9.0, 8.0, 9.5, 8.5] * 3  # steps 1-15
    fit = [20.0 * 0.99**i for i in range(50)]  # steps 16-65: from the initial weights again
    w = win(trials + fit)
    params = EarlyParams(check="rise", at_step=50, chunk=20, factor=1.3)
    before = detect(w, params, Context(step=65, now=0.0))
    assert before is not None and before.firing and before.baseline == 9.5
    after = detect(w, params, Context(step=65, now=0.0, rewrite_step=16))
    assert after is not None and not after.firing
    assert after.baseline == pytest.approx((fit[9] + fit[10]) / 2)  # the fit's own first 20 steps


def test_a_rise_of_the_median_within_the_noise_is_no_rise() -> None:
    """A small-batch loss whose batches span 4-22: the median of its last 20 samples is
    1.35× that of its first 20 by chance, and the samples interleave (a fit after
    Lightning's lr_find paged a critical EarlyLossRising so). A loss that rose has its last
    samples above its first."""
    first = [4.0, 22.0, 6.0, 18.0, 5.0, 20.0, 7.0, 15.0, 8.0, 12.0] * 2
    middle = [10.0] * 20
    noisy = first + middle + [1.35 * v for v in reversed(first)]  # steps 1-60
    risen = first + middle + [30.0 + v for v in first]
    params = {"check": "rise", "at_step": 50, "chunk": 20, "factor": 1.3}
    assert verdict(noisy, **params) is True  # the medians alone
    assert verdict(noisy, separation=0.8, **params) is False
    assert verdict(risen, separation=0.8, **params) is True


# the PyTorch tutorial's cubic polynomial (polynomial_custom_module.py): its update ratios
# and summed losses of steps 1-6, falling at every step
POLY_UAR = [0.46, 0.233, 0.125, 0.083, 0.069, 0.064]
POLY_LOSS = [295568.6, 85235.8, 40748.2, 28699.8, 23413.0, 19880.7]


@pytest.mark.parametrize(
    ("loss", "fires"),
    [
        (POLY_LOSS, False),  # each large update lowered the loss: a descent from a far start
        ([295568.6, 85235.8, 90000.0, 28699.8, 23413.0, 19880.7], False),  # one noisy batch: still falling
        ([295568.6, 85235.8, 600000.0, 28699.8, 23413.0, 19880.7], True),  # risen to twice its start: thrown
        ([295568.6, 85235.8, -1.0, 28699.8, 23413.0, 19880.7], True),  # a loss not above 0: no ratios to read
        (None, True),  # no loss reported: the updates alone decide
    ],
)
def test_large_first_updates_that_lower_the_loss(loss: list[float] | None, fires: bool) -> None:
    p = EarlyParams(check="above", value=0.1, count=3, unless_falling=True, factor=2.0, at_step=10)
    assert p.reference_samples() == 101 and EarlyParams(check="above").reference_samples() == 0
    ctx = Context(step=6, now=0.0, reference_window=None if loss is None else win(loss))
    v = detect(win(POLY_UAR), p, ctx)
    assert v is not None and v.firing is fires and v.value == 3.0


# d2l.ai's linear regression (3.3, concise): weights drawn with a standard deviation of 0.01,
# SGD at lr 0.03 on batches of 10: its update ratios (UAR) and batch losses of steps 1-12
D2L_UAR = [43.45, 1.4997, 0.3166, 0.2244, 0.0882, 0.1798, 0.1208, 0.1044, 0.0571, 0.1195, 0.0367, 0.074]
D2L_LOSS = [34.62, 45.86, 22.33, 21.62, 9.995, 20.08, 15.08, 8.98, 5.951, 15.48, 5.282, 9.568]


@pytest.mark.parametrize(
    ("loss", "fires"),
    [
        (D2L_LOSS, [False] * 12),  # noisy batches, but ten of them brought the level from 34.6 to 9
        ([34.62, 45.86, 22.33, 21.62, 80.0] + D2L_LOSS[5:], [False] * 4 + [True] * 8),  # risen to 2.3×: at once
        # a level that stays where it began: judged at the tenth loss
        ([34.62, 45.86, 22.33, 31.0, 36.0, 29.0, 40.0, 33.0, 30.0, 38.0, 35.0, 30.0], [False] * 9 + [True] * 3),
        # ... and one that has fallen by 5 % only (median 32.9 against 34.62)
        ([34.62, 45.86, 22.33, 31.0, 36.0, 29.0, 40.0, 32.9, 30.0, 32.9, 33.0, 30.0], [False] * 9 + [True] * 3),
    ],
)
def test_large_first_updates_wait_for_ten_losses_unless_the_loss_doubles(loss: list[float], fires: list[bool]) -> None:
    p = EarlyParams(check="above", value=0.1, count=3, unless_falling=True, factor=2.0, at_step=10)
    got = []
    for step in range(1, 13):
        ctx = Context(step=step, now=0.0, reference_window=win(loss[:step]))
        v = detect(win(D2L_UAR[:step]), p, ctx)
        got.append(v is not None and v.firing)
    assert got == fires, got
    assert "; the loss fell to 0.26 of its start (34.62 → 8.98) meanwhile" in detect(
        win(D2L_UAR), p, Context(step=10, now=0.0, reference_window=win(D2L_LOSS[:10]))).detail


# Adam at lr 0.01 (a tenth of the lr torch-lr-finder's range test found best) on a fresh MLP
# 32-128-128-10 of PyTorch's default initialisation, batches of 64: the update ratios of its
# first 10 steps and its batch losses. The loss fell by 18 % in ten steps (by half in twenty);
# with the loss's level to fall to 2/3 of its start in ten steps, it paged critical at step 10.
ADAM_UAR = [0.161, 0.1206, 0.1064, 0.0972, 0.0946, 0.093, 0.0892, 0.0864, 0.0844, 0.0812]
ADAM_LOSS = [2.306, 2.271, 2.19, 2.224, 2.177, 2.059, 2.076, 1.873, 1.782, 1.875]


def test_large_first_updates_of_a_loss_falling_slower_than_a_third_are_no_fault() -> None:
    p = EarlyParams(check="above", value=0.1, count=3, unless_falling=True, factor=2.0, at_step=10)
    v = detect(win(ADAM_UAR), p, Context(step=10, now=0.0, reference_window=win(ADAM_LOSS)))
    assert v is not None and not v.firing
    assert v.detail.endswith("; the loss fell to 0.82 of its start (2.271 → 1.873) meanwhile"), v.detail
    flat = ADAM_LOSS[:7] + [2.2, 2.15, 2.19]  # the same updates, a loss that stayed where it began
    assert detect(win(ADAM_UAR), p, Context(step=10, now=0.0, reference_window=win(flat))).firing


@pytest.mark.parametrize("rises", [False, True])
def test_the_default_pack_reads_the_loss_beside_the_large_first_updates(rises: bool) -> None:
    eng, store = _engine()
    labels = labels_of(job="j", run="r", rank=0)
    fired = []
    for step, (uar, loss) in enumerate(zip(POLY_UAR, POLY_LOSS), 1):
        store.add("sentinel_loss", labels, step, float(step), 1e6 if rises and step == 3 else loss)
        store.add("sentinel_update_mean_abs_ratio", labels, step, float(step), uar)
        fired += [t.alertname for t in eng.evaluate("j", "r", 0, step, float(step)) if t.state_to == "firing"]
    assert ("EarlyUpdateTooLarge" in fired) is rises, fired
