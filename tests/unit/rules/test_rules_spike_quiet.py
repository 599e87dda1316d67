"""The spike rules' shortcut (rules/spike.py ``quiet``) changes no alert: the rule engine
with it and without it makes the same transitions on the same series, and with it most
samples take no full verdict."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

import pytest

from sentinel.rules import RuleEngine, Transition, load_pack
from sentinel.rules.ingested import Ingested
from sentinel.store import Store, labels_of

Series = Callable[[int], float]


def _noisy(seed: int, sigma: float) -> Callable[[], float]:
    rng = random.Random(seed)
    return lambda: math.exp(rng.gauss(0.0, sigma))


def _steady(seed: int, sigma: float = 0.3) -> Series:
    n = _noisy(seed, sigma)
    return lambda s: 2.0 * n()


def _spikes(at: set[int], seed: int, size: float = 8.0) -> Series:
    n = _noisy(seed, 0.1)
    return lambda s: 2.0 * n() * (size if s in at else 1.0)


def _with(values: dict[int, float], seed: int) -> Series:
    n = _noisy(seed, 0.1)
    return lambda s: values.get(s, 2.0 * n())


def _margin(seed: int) -> Series:
    """A triplet loss at its floor of 0 most steps, sometimes above it, once far above."""
    rng = random.Random(seed)
    return lambda s: 40.0 if s == 300 else (rng.uniform(0.1, 0.5) if rng.random() < 0.3 else 0.0)


def _falling(seed: int) -> Series:
    n = _noisy(seed, 0.05)
    return lambda s: 5.0 * math.exp(-s / 60.0) * n() * (60.0 if s == 250 else 1.0)


def _run(values: list[float], quiet: bool, skip: set[int], lr_change_at: int | None,
         ) -> tuple[list[tuple[object, ...]], int]:
    pack = load_pack({"rules": {"LossSpike": {"enabled": True}, "GradientSpike": {"enabled": True}}})
    store = Store()
    engine = RuleEngine(pack, store)
    verdicts = [0]

    def counted(fn: Callable[..., object]) -> Callable[..., object]:
        def detect(*args: object) -> object:
            verdicts[0] += 1
            return fn(*args)
        return detect

    for i, c in enumerate(engine._step_rules):
        if c.rule.kind == "spike":
            spec = dataclasses.replace(c.spec, fn=counted(c.spec.fn), quiet=c.spec.quiet if quiet else None)
            engine._step_rules[i] = dataclasses.replace(c, spec=spec)
    labels = labels_of(job="j", run="r", rank=0)
    out: list[Transition] = []
    for step in range(1, len(values) + 1):
        t = float(step)
        store.add("sentinel_loss", labels, step, t, values[step - 1])
        store.add("sentinel_grad_norm", labels, step, t, values[step - 1] * 3.0)
        if step in skip:
            continue  # sampled, not judged (a frame the engine took for no rule of these)
        lr = lr_change_at if lr_change_at is not None and step >= lr_change_at else None
        written = frozenset({"sentinel_loss", "sentinel_grad_norm"})
        out += engine.evaluate("j", "r", 0, step, t, Ingested(lr_change_step=lr, written=written))
    trs = [(x.alertname, x.state_from, x.state_to, x.step, x.value, x.threshold, x.summary) for x in out
           if x.alertname in ("LossSpike", "GradientSpike")]
    return trs, verdicts[0]


@pytest.mark.parametrize(
    ("series", "skip", "lr_change_at", "fires", "shortcut"),
    [
        (_steady(0), set(), None, False, True),
        (_steady(1, sigma=0.45), set(), None, False, True),  # heavy noise: near the threshold often
        (_spikes({150, 151, 300}, 2), set(), None, True, True),
        (_spikes({200}, 3), {120, 121, 122, 199}, None, True, True),  # samples the rules did not judge
        (_with({100: math.nan, 101: math.inf, 180: 30.0}, 4), set(), None, True, True),
        (_with({i: math.nan for i in range(60, 75)} | {240: 30.0}, 5), set(), None, True, True),
        (_margin(6), set(), None, True, False),  # at its floor of 0 every verdict is full
        (_falling(7), set(), 120, True, True),
    ],
)
def test_the_shortcut_changes_no_transition(series: Series, skip: set[int], lr_change_at: int | None,
                                            fires: bool, shortcut: bool) -> None:
    values = [series(s) for s in range(1, 401)]
    with_quiet, n_quiet = _run(values, True, skip, lr_change_at)
    without, n_full = _run(values, False, skip, lr_change_at)
    assert with_quiet == without
    assert any(x[2] == "firing" for x in with_quiet) is fires
    if shortcut:
        assert n_quiet < n_full / 5  # the shortcut did take over: most samples need no full verdict
