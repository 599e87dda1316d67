"""The trend rule's shortcut (rules/trend.py ``quiet``) changes no alert: the rule engine
with it and without it makes the same transitions on the same losses."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

import pytest

from sentinel.rules import RuleEngine, Transition, load_pack
from sentinel.rules.ingested import Ingested
from sentinel.store import Store, labels_of

Loss = Callable[[int], float]


def _noisy(seed: int, sigma: float = 0.03) -> Callable[[], float]:
    rng = random.Random(seed)
    return lambda: math.exp(rng.gauss(0.0, sigma))


def _steady(seed: int) -> Loss:
    n = _noisy(seed)
    return lambda s: 2.0 * n()


def _rise(at: int, rate: float, seed: int) -> Loss:
    n = _noisy(seed)
    return lambda s: 2.0 * (rate ** max(0, s - at)) * n()


def _rise_and_back(at: int, seed: int) -> Loss:
    n = _noisy(seed)
    return lambda s: 2.0 * (1.08 ** max(0, min(s, at + 15) - at)) * n()


def _with_nan(at: int, seed: int) -> Loss:
    n = _noisy(seed)
    return lambda s: math.nan if s == at else 2.0 * n()


def _run(losses: list[float], quiet: bool, lr_change_at: int | None = None,
         skip: set[int] = frozenset()) -> tuple[list[tuple[object, ...]], int]:
    pack = load_pack({"rules": {"LossRising": {"enabled": True}}})
    store = Store()
    engine = RuleEngine(pack, store)
    if not quiet:
        for c in engine._step_rules:
            if c.rule.kind == "trend":
                engine._step_rules[engine._step_rules.index(c)] = dataclasses.replace(
                    c, spec=dataclasses.replace(c.spec, quiet=None))
    labels = labels_of(job="j", run="r", rank=0)
    out: list[Transition] = []
    for step in range(1, len(losses) + 1):
        if step in skip:
            continue  # no report at this step: the next sample is not the one after
        t = float(step)
        store.add("sentinel_loss", labels, step, t, losses[step - 1])
        lr = lr_change_at if lr_change_at is not None and step >= lr_change_at else None
        out += engine.evaluate("j", "r", 0, step, t, Ingested(lr_change_step=lr, written=frozenset({"sentinel_loss"})))
    trs = [(x.alertname, x.state_from, x.state_to, x.step, x.value, x.threshold, x.summary) for x in out
           if x.alertname == "LossRising"]
    return trs, engine.evaluations


@pytest.mark.parametrize(
    ("loss", "lr_change_at", "skip", "fires"),
    [
        (_steady(0), None, set(), False),
        (_rise(200, 1.05, 1), None, set(), True),
        (_rise_and_back(150, 2), None, set(), True),
        (_rise(300, 1.05, 3), 295, set(), True),  # right after an lr change: detect's other path
        (_rise(300, 1.05, 4), 100, set(), True),  # long after one
        (_with_nan(250, 5), None, set(), False),
        (_rise(200, 1.05, 6), None, {120, 121, 199, 203}, True),  # steps the rank did not report
    ],
)
def test_the_shortcut_changes_no_transition(loss: Loss, lr_change_at: int | None, skip: set[int],
                                            fires: bool) -> None:
    losses = [loss(s) for s in range(1, 401)]
    with_quiet, n_quiet = _run(losses, True, lr_change_at, skip)
    without, n_full = _run(losses, False, lr_change_at, skip)
    assert with_quiet == without
    assert any(x[2] == "firing" for x in with_quiet) is fires
    if lr_change_at is None:
        assert n_quiet < n_full  # the shortcut did take over (fewer verdicts taken)
