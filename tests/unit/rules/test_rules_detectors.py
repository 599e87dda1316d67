"""Table-driven tests of the pure detectors on synthetic series, must-not-fire cases included."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.rules import DETECTORS
from sentinel.rules.band import BandParams
from sentinel.rules.base import Context, finite, median, quantile, since
from sentinel.rules.divergence import DivergenceParams
from sentinel.rules.drop import DropParams
from sentinel.rules.forecast import ForecastParams
from sentinel.rules.nonfinite import NonFiniteParams
from sentinel.rules.oscillation import OscillationParams, unpredictable_fraction
from sentinel.rules.plateau import PlateauParams
from sentinel.rules.spike import SpikeParams
from sentinel.rules.stall import StallParams
from sentinel.rules.threshold import ThresholdParams
from sentinel.store import Window

RNG = np.random.default_rng(1234)


def win(values: Any, start: int = 0, dt: float = 1.0) -> Window:
    v = np.asarray(values, dtype=np.float64)
    steps = np.arange(start, start + len(v), dtype=np.int64)
    return Window(steps, steps.astype(np.float64) * dt, v)


def ctx(**kw: Any) -> Context:
    kw.setdefault("step", 0)
    kw.setdefault("now", 0.0)
    return Context(**kw)


def fires(kind: str, w: Window, params: Any, c: Context) -> bool | None:
    """The detector's firing flag, or None for no verdict."""
    v = DETECTORS[kind].fn(w, params, c)
    return None if v is None else v.firing


def noisy(level: float, rel: float, n: int) -> list[float]:
    """A flat series with Gaussian relative noise ``rel``."""
    return list(level * (1.0 + rel * RNG.standard_normal(n)).clip(0.05))


def sgd_loss(n: int, rel: float = 0.08, start: float = 2.0, tau: float = 800.0) -> list[float]:
    """A healthy, slowly falling per-batch loss with ``rel`` relative noise."""
    t = np.arange(n)
    trend = 0.4 + (start - 0.4) * np.exp(-t / tau)
    return list(trend * (1.0 + rel * RNG.standard_normal(n)).clip(0.05))


def test_registry_names_every_kind() -> None:
    assert set(DETECTORS) == {
        "threshold", "band", "nonfinite", "spike", "divergence", "oscillation", "plateau",
        "forecast", "drop", "stall", "exited", "early", "scheduled", "skip", "trend", "collapse",
    }  # fmt: skip
    assert [k for k, s in DETECTORS.items() if s.time_based] == ["stall"]


# -- threshold ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "params", "fires"),
    [
        ([1.0, 2000.0], {"op": ">", "value": 1000.0}, True),
        ([2000.0, 5.0], {"op": ">", "value": 1000.0}, False),
        ([1e-9], {"op": "<", "value": 1e-7}, True),
        ([1e-3], {"op": "<", "value": 1e-7}, False),
        ([0.5], {"op": ">=", "value": 0.5}, True),
        ([0.5], {"op": ">", "value": 0.5}, False),
        ([math.inf], {"op": ">", "value": 1000.0}, True),
        ([0.2, 0.9, 0.9], {"op": ">", "value": 0.5, "reduce": "median", "window": 3}, True),
        ([0.2, 0.2, 0.9], {"op": ">", "value": 0.5, "reduce": "mean", "window": 3}, False),
        ([0.2, 0.2, 0.9], {"op": ">", "value": 0.5, "reduce": "max", "window": 3}, True),
        ([0.9, 0.9, 0.2], {"op": ">", "value": 0.5, "reduce": "min", "window": 3}, False),
    ],
)
def test_threshold(values: list[float], params: dict[str, Any], fires: bool) -> None:
    v = DETECTORS["threshold"].fn(win(values), ThresholdParams(**params), ctx())
    assert v is not None and v.firing is fires


@pytest.mark.parametrize(
    ("values", "params"),
    [
        ([], {"value": 1.0}),
        ([math.nan], {"value": 1.0}),  # NaN is the nonfinite rule's, neither fires nor resolves
        ([0.0], {"op": "<", "value": 1e-7, "skip_zero": True}),  # frozen group: no gradient
    ],
)
def test_threshold_no_verdict(values: list[float], params: dict[str, Any]) -> None:
    assert DETECTORS["threshold"].fn(win(values), ThresholdParams(**params), ctx()) is None


# -- band -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "params", "fires"),
    [
        ([5.0, 5.0, 5.0], {"low": 1.0, "high": 4.0, "consecutive": 3}, True),
        ([5.0, 2.0, 5.0], {"low": 1.0, "high": 4.0, "consecutive": 3}, False),
        ([0.5, 0.1, 0.2], {"low": 1.0, "consecutive": 2}, True),
        ([2.0], {"low": 1.0, "high": 4.0}, False),
    ],
)
def test_band(values: list[float], params: dict[str, Any], fires: bool) -> None:
    v = DETECTORS["band"].fn(win(values), BandParams(**params), ctx())
    assert v is not None and v.firing is fires


def test_band_needs_enough_samples_and_ordered_bounds() -> None:
    assert DETECTORS["band"].fn(win([9.0]), BandParams(high=4.0, consecutive=3), ctx()) is None
    with pytest.raises(ValueError, match="low must be below high"):
        BandParams(low=2.0, high=1.0)


# -- nonfinite ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "source", "amp_skipped", "fires"),
    [
        (1.0, "loss", False, True),
        (1.0, "param", False, True),
        (1.0, "grad", False, True),
        (0.0, "grad", False, False),
        (math.nan, "loss", False, True),
        (1.0, "grad", True, False),  # normal fp16 overflow: GradScaler skips the step
        (1.0, "param", True, True),  # but params going NaN is never normal
    ],
)
def test_nonfinite(flag: float, source: str, amp_skipped: bool, fires: bool) -> None:
    c = ctx(series={"source": source}, amp_skipped=amp_skipped,
            nonfinite_groups={source: ["layers.3", "layers.4"]})  # fmt: skip
    v = DETECTORS["nonfinite"].fn(win([0.0, flag]), NonFiniteParams(), c)
    assert v is not None and v.firing is fires
    assert v.groups == (("layers.3", "layers.4") if fires else ())
    assert v.detail == source


# -- spike ----------------------------------------------------------------------------

_SPIKE: dict[str, Any] = {"window": 50, "min_samples": 20, "factor": 10.0, "z": 6.0}


@pytest.mark.parametrize(
    ("values", "params", "fires"),
    [
        # the seeds' example: grad norm 1.0 → 50.0
        ([1.0] * 60 + [50.0], _SPIKE, True),
        (noisy(1.0, 0.1, 60) + [50.0], _SPIKE, True),
        (noisy(1.0, 0.1, 60) + [3.0], _SPIKE, False),  # 3× is not a 10× spike
        # slow ramps never fire: the median follows them
        (list(np.linspace(1.0, 5.0, 300)), _SPIKE, False),
        (list(np.geomspace(1.0, 100.0, 300)), _SPIKE, False),
        # very noisy series: its ordinary extremes are not spikes
        (list(np.exp(1.0 * RNG.standard_normal(60))) + [12.0], _SPIKE, False),
        # loss spike 3×
        (noisy(2.0, 0.08, 60) + [7.0], {"factor": 3.0, "z": 6.0, "min_samples": 20}, True),
        (noisy(2.0, 0.08, 60) + [3.0], {"factor": 3.0, "z": 6.0, "min_samples": 20}, False),
        # non-positive series: linear scale
        ([-1.0, 1.0] * 30 + [40.0], {"factor": 10.0, "z": 6.0, "min_samples": 20}, True),
    ],
)
def test_spike(values: list[float], params: dict[str, Any], fires: bool) -> None:
    v = DETECTORS["spike"].fn(win(values), SpikeParams(**params), ctx())
    assert v is not None and v.firing is fires


def test_spike_reports_value_baseline_threshold() -> None:
    v = DETECTORS["spike"].fn(win([1.0] * 60 + [50.0]), SpikeParams(**_SPIKE), ctx())
    assert v is not None
    assert (v.value, v.baseline, v.threshold) == pytest.approx((50.0, 1.0, 10.0))


def test_a_spike_of_a_loss_below_zero_says_how_far_above_its_baseline() -> None:
    """A loss without a floor at 0 (uncertainty-weighted multi-task losses with learned
    log-variances sit around -2.3): the message said "()" where a ratio has no meaning."""
    values = [-2.3 + 0.1 * math.sin(i) for i in range(60)] + [0.33]
    v = DETECTORS["spike"].fn(win(values), SpikeParams(window=100, min_samples=20, factor=1.5, z=5.0), ctx())
    assert v is not None and v.firing
    assert v.detail == "2.62 above the baseline -2.29, 22.9× its usual spread"
    # a positive baseline keeps its ratio
    v = DETECTORS["spike"].fn(win([1.0] * 60 + [50.0]), SpikeParams(**_SPIKE), ctx())
    assert v is not None and v.detail == "50× the baseline 1"


def test_a_loss_resting_at_exactly_0_is_judged_by_its_samples_above_0() -> None:
    """A triplet loss once the embeddings separate: 0 at most steps, a few batches that
    miss a margin by a little. One such batch read "10⁹ times its usual spread" before."""
    rng = np.random.default_rng(0)
    values = [float(rng.uniform(0.001, 0.01)) if i % 9 == 0 else 0.0 for i in range(100)]
    above = sorted(v for v in values if v > 0)
    med = float(np.median(above))
    p = SpikeParams(window=100, min_samples=20, factor=1.5, z=5.0)
    for last, fires in ((0.001, False), (0.02, False), (0.5, True)):
        v = DETECTORS["spike"].fn(win(values + [last]), p, ctx())
        assert v is not None and v.firing is fires, (last, v)
        assert v.baseline == 0.0 and v.threshold == pytest.approx(1.5 * med)
    assert v.detail == f"{0.5 / med:.3g}× the median {med:.3g} of the {len(above)} of 100 before it above 0"
    # fewer than 5 samples above 0 (a margin met by almost every batch): no scale, no verdict
    assert DETECTORS["spike"].fn(win([0.0] * 96 + [0.01] * 4 + [0.5]), p, ctx()) is None


def test_a_spike_on_the_scripts_schedule_is_no_spike() -> None:
    """Lazy regularization (rosinality's StyleGAN2 ``train.py``): every 17th step of the
    discriminator's stream is its R1 step, with a gradient norm 10-25× the others'. The
    third such spike, at the interval of the two before it, is the script's schedule,
    warm-up samples counted; one at another step, or the second of a schedule, fires."""
    rng = np.random.default_rng(0)
    values = [float(rng.uniform(0.5, 1.0)) for _ in range(70)]
    for s in (2, 19, 36, 53):
        values[s] = float(rng.uniform(10.0, 25.0))
    p = SpikeParams(window=100, min_samples=20, factor=3.0, z=6.0)
    on = DETECTORS["spike"].fn(win(values[:54]), p, ctx(since_step=20))
    assert on is not None and on.firing is False and on.value == values[53]
    assert on.detail.endswith("; as at steps 19 and 36: every 17 steps, the script's schedule (a regularization "
                              "step), not a spike"), on.detail
    # the same spike two steps early: uneven, a spike
    off = values[:52] + [values[53]]
    assert fires("spike", win(off), p, ctx(since_step=20)) is True
    # the second of a schedule (one before it in the window) fires; so does every spike without the option
    second = values[:37]
    second[2] = 0.7
    assert fires("spike", win(second), p, ctx(since_step=0)) is True
    assert fires("spike", win(values[:37]), p, ctx(since_step=0)) is False  # the third
    assert fires("spike", win(values[:54]), p.model_copy(update={"skip_periodic": False}), ctx(since_step=20)) is True


def test_a_level_the_series_keeps_visiting_is_no_spike() -> None:
    """MT-DNN's shape: each batch from one task, drawn in proportion to the tasks' sizes; a
    task at 15 % of the batches whose loss is 10× the others'. From the baseline's share of
    samples at the level (5 %, and two), it is one of the series' levels; a series that
    reached it at fewer of its samples still spikes there, at uneven steps."""
    rng = np.random.default_rng(0)
    values = [float(rng.uniform(8.0, 12.0)) if rng.random() < 0.15 else float(rng.uniform(0.8, 1.2))
              for _ in range(200)]
    p = SpikeParams(window=100, min_samples=20, factor=1.5, z=5.0)
    verdicts = [DETECTORS["spike"].fn(win(values[:i + 1]), p, ctx(since_step=0)) for i in range(40, 200)]
    high = [v for v in verdicts if v is not None and v.value > 5.0]
    assert len(high) > 15 and not any(v.firing for v in high)
    assert "of the 100 samples before it reached" in high[-1].detail and high[-1].detail.endswith(
        "too: a level of the series (tasks or sources of different losses), not a spike")
    rare = [float(rng.uniform(0.8, 1.2)) for _ in range(100)]
    for s in (20, 47, 81):  # 3 % of the window, at uneven steps
        rare[s] = 10.0
    assert fires("spike", win(rare + [10.0]), p, ctx()) is True
    assert fires("spike", win(values[:150]), p.model_copy(update={"max_share": 0.0}), ctx()) is (values[149] > 5.0)


@pytest.mark.parametrize(
    ("values", "since_step"),
    [
        ([1.0] * 5 + [50.0], 0),  # too few samples
        ([1.0] * 60 + [math.nan], 0),  # non-finite latest: the nonfinite rule's
        # warm-up: a fast fall from 100 to 1 in the first steps is not a baseline
        (list(np.geomspace(100.0, 1.0, 30)) + [1.0] * 10 + [30.0], 30),
    ],
)
def test_spike_no_verdict(values: list[float], since_step: int) -> None:
    v = DETECTORS["spike"].fn(win(values), SpikeParams(**_SPIKE), ctx(since_step=since_step))
    assert v is None


def test_spike_ignores_baseline_before_lr_change() -> None:
    # lr decayed 10× at step 100: the update-sized series drops 10×, then recovers a bit
    values = noisy(1.0, 0.05, 100) + noisy(0.1, 0.05, 30) + [1.2]
    p = SpikeParams(**_SPIKE)
    assert DETECTORS["spike"].fn(win(values), p, ctx(since_step=100)) is not None
    # with the pre-decay samples trimmed, 1.2 is a 12× spike over the new level
    assert fires("spike", win(values), p, ctx(since_step=100)) is True
    # a decay *down* never fires a spike, with or without trimming
    down = noisy(1.0, 0.05, 100) + noisy(0.1, 0.05, 30)
    assert fires("spike", win(down), p, ctx()) is False


# -- divergence -----------------------------------------------------------------------

_DIV: dict[str, Any] = {"window": 400, "recent": 20, "chunk": 20, "factor": 2.0, "min_samples": 80}


@pytest.mark.parametrize(
    ("values", "fires"),
    [
        (sgd_loss(400), False),
        (sgd_loss(400, rel=0.2), False),  # very noisy but healthy
        (noisy(1.0, 0.05, 300) + list(np.geomspace(1.0, 4.0, 100)), True),  # sustained climb
        (noisy(1.0, 0.05, 350) + noisy(3.0, 0.05, 50), True),  # jumped and stayed
        (noisy(1.0, 0.05, 390) + [9.0] * 3 + noisy(1.0, 0.05, 7), False),  # a few bad batches
        (noisy(1.0, 0.05, 200) + list(np.linspace(1.0, 1.5, 200)), False),  # mild drift
    ],
)
def test_divergence(values: list[float], fires: bool) -> None:
    v = DETECTORS["divergence"].fn(win(values), DivergenceParams(**_DIV), ctx())
    assert v is not None and v.firing is fires


def test_divergence_respects_lr_change() -> None:
    # lr raised at step 300 (warm restart): loss rises 2.5× then settles; baseline restarts
    values = noisy(1.0, 0.05, 300) + noisy(2.5, 0.05, 100)
    p = DivergenceParams(**_DIV)
    assert fires("divergence", win(values), p, ctx()) is True
    assert DETECTORS["divergence"].fn(win(values), p, ctx(since_step=300)) is not None
    assert fires("divergence", win(values), p, ctx(since_step=300)) is False
    assert DETECTORS["divergence"].fn(win(values[:50]), p, ctx()) is None


def _signed(level: Any, sigma: float, n: int, seed: int) -> list[float]:
    """A loss whose zero means nothing (PPO's clipped surrogate + value loss - entropy bonus,
    a VAE's Gaussian negative ELBO): ``level`` (a number, or one per sample) plus Gaussian
    noise of ``sigma``, not clipped at 0."""
    rng = np.random.default_rng(seed)
    return list(np.broadcast_to(np.asarray(level, dtype=np.float64), (n,)) + sigma * rng.standard_normal(n))


# the default pack's levels: medians of 50 samples over a 400-sample window
_DIV_PACK: dict[str, Any] = {"window": 400, "recent": 50, "chunk": 50, "factor": 2.0, "min_samples": 100}


@pytest.mark.parametrize(
    ("values", "fires"),
    [
        # PPO: the level wanders across 0 by ~1.6 noise σ on a clean run (tests/programs/ppo.py:
        # best chunk -0.0085, last 50 at +0.0061, σ 0.0093); "twice the best" of a level
        # near 0 is any rise at all
        (_signed(-0.008, 0.01, 200, 1) + _signed(0.006, 0.01, 50, 2), False),
        (_signed(0.0, 0.01, 150, 3) + _signed(0.012, 0.01, 100, 4), False),
        (_signed(-0.001, 0.002, 200, 5) + _signed(0.001, 0.002, 50, 6), False),
        # a negative ELBO falling through 0 and on (tests/programs/vae_elbo.py)
        (_signed(np.linspace(9.0, -4.0, 400), 0.3, 400, 7), False),
        # ... the real faults still fire: PPO's value loss blowing up to 30× the noise
        (_signed(0.0, 0.01, 200, 8) + _signed(0.3, 0.05, 50, 9), True),
        # a fitted VAE thrown back above 0 and staying there
        (_signed(-4.0, 0.3, 300, 10) + _signed(1.0, 0.3, 100, 11), True),
        # a negative level: a rise of half its size is not "twice", one of more than its size is
        (_signed(-1.0, 0.01, 300, 12) + _signed(-0.5, 0.01, 100, 13), False),
        (_signed(-1.0, 0.01, 300, 14) + _signed(0.2, 0.01, 100, 15), True),
    ],
)
def test_divergence_of_a_loss_that_crosses_zero(values: list[float], fires: bool) -> None:
    v = DETECTORS["divergence"].fn(win(values), DivergenceParams(**_DIV_PACK), ctx())
    assert v is not None and v.firing is fires, v


def _floor(level: float, n: int, seed: int) -> list[float]:
    """Batch losses of a regression fitted down to its noise floor: heavy-tailed above their
    median (a sine fitted by Adam, batch 10: the 90th percentile 3-7× the median, the robust
    spread about the median itself), here log-normal with a log-spread of 1.4."""
    return list(level * np.exp(1.4 * np.random.default_rng(seed).standard_normal(n)))


@pytest.mark.parametrize(
    ("later", "fires"),
    [
        # the level wandering to 2.5× within the batches' spread: the sine fine-tune's
        # 0.0004 -> 0.0011 read "2.87× the best level" and paged critical
        (2.5, False),
        # thrown well past the spread, and far past it
        (5.0, True),
        (30.0, True),
    ],
)
def test_divergence_of_a_loss_at_its_noise_floor(later: float, fires: bool) -> None:
    values = _floor(0.0004, 350, 1) + _floor(0.0004 * later, 50, 2)
    v = DETECTORS["divergence"].fn(win(values), DivergenceParams(**_DIV_PACK), ctx())
    assert v is not None and v.firing is fires, v
    assert v.value / v.baseline > 4.0  # by the ratio alone, each of them "diverged"


# -- oscillation ----------------------------------------------------------------------

_OSC: dict[str, Any] = {"window": 100, "min_samples": 50, "amplitude": 0.3}
_t = np.arange(100)


@pytest.mark.parametrize(
    ("values", "fires"),
    [
        (noisy(1.0, 0.05, 100), False),
        (noisy(1.0, 0.10, 100), False),  # the seeds: within 10 % is acceptable
        (sgd_loss(100, rel=0.1, tau=200), False),
        (list(0.3 + 2.0 * np.exp(-_t / 20)), False),  # fast fall with a floor: a bend, not swings
        (list(1.0 + 0.4 * np.where(_t % 2 == 0, 1, -1)), True),  # lr too high: zig-zag ±40 %
        (list(1.0 + 0.45 * np.sin(2 * np.pi * _t / 25)), True),  # unshuffled data: periodic
        (list((1.0 + 0.45 * np.sin(2 * np.pi * _t / 10)) * np.exp(-_t / 100)), True),
        (list(1.0 + 0.2 * np.where(_t % 2 == 0, 1, -1)), False),  # ±20 %: below 30 %
        # small-batch noise: ±50 % amplitude, but independent from step to step
        (noisy(1.0, 0.35, 100), False),
        # unshuffled data: blocks of 4 batches alternate between two levels, plus noise
        (list((1.0 + 0.4 * np.where((_t // 4) % 2, 1, -1)) * (1 + 0.1 * RNG.standard_normal(100))), True),
    ],
)
def test_oscillation(values: list[float], fires: bool) -> None:
    v = DETECTORS["oscillation"].fn(win(values), OscillationParams(**_OSC), ctx())
    assert v is not None and v.firing is fires


def test_oscillation_amplitude_is_relative_half_width() -> None:
    values = list(1.0 + 0.3 * np.where(_t % 2 == 0, 1, -1))
    v = DETECTORS["oscillation"].fn(win(values), OscillationParams(**_OSC), ctx())
    assert v is not None and v.value == pytest.approx(0.3, abs=0.02)


def test_oscillation_ignores_lr_decay_step() -> None:
    # lr decayed at step 60: loss drops from 1.0 to 0.4 — a step, not oscillation
    values = noisy(1.0, 0.03, 60) + noisy(0.4, 0.03, 40)
    w = win(values)
    p = OscillationParams(window=100, min_samples=30, amplitude=0.3)
    assert DETECTORS["oscillation"].fn(w, p, ctx(since_step=60)) is not None
    assert fires("oscillation", w, p, ctx(since_step=60)) is False


def test_oscillation_min_amplitude_guards_tiny_losses() -> None:
    values = list(1e-4 * (1.0 + 0.5 * np.where(_t % 2 == 0, 1, -1)))
    p = OscillationParams(**_OSC, min_amplitude=1e-3)
    assert fires("oscillation", win(values), p, ctx()) is False


def _rollouts(level: Any, sigma: float, between: float, n: int, seed: int, every: int = 16) -> list[float]:
    """A PPO-like loss: ``level`` plus Gaussian noise of ``sigma``, plus a level of its own
    (Gaussian, ``between``) for each rollout of ``every`` minibatches, not clipped at 0."""
    rng = np.random.default_rng(seed)
    offsets = np.repeat(between * rng.standard_normal(n // every + 1), every)[:n]
    return list(np.broadcast_to(np.asarray(level, dtype=np.float64), (n,)) + offsets + sigma * rng.standard_normal(n))


_zz = np.where(_t % 2 == 0, 1.0, -1.0)  # a two-level bounce: lr too high
_blocks = np.where((_t // 4) % 2, 1.0, -1.0)  # blocks of 4 similar batches: unshuffled data


# the old ratio to |mean| in the comments: it fired on every clean row with Q above 30
@pytest.mark.parametrize(
    ("values", "fires"),
    [
        # PPO (tests/programs/ppo.py): noise 0.01 around a level drifting across 0, each
        # rollout of 16 minibatches 0.006 off it; was ±1400 % and ±3600 % with Q 47 and 36
        (_rollouts(np.linspace(-0.008, 0.006, 100), 0.01, 0.006, 100, 13), False),
        (_rollouts(np.linspace(-0.008, 0.006, 100), 0.01, 0.006, 100, 21), False),
        (_signed(np.linspace(-0.008, 0.006, 100), 0.01, 100, 101), False),  # was ±1190 %, Q 18
        # a WGAN critic's loss, below 0, the generator's turns every 5 steps; was ±37 %, Q 20
        (_rollouts(np.linspace(-0.6, -0.4, 100), 0.1, 0.06, 100, 1000, every=5), False),
        # a negative ELBO falling through 0 (tests/programs/vae_elbo.py); was ±72 %, Q 10
        (_signed(np.linspace(3.0, -2.0, 100), 0.2, 100, 200), False),
        # ... falling fast along an exponential: its bend is no swing; was ±339 % and ±53 %,
        # Q 187 and 238 (the first is above the bar, the level guard vetoes it)
        (_signed(-4.0 + 13.0 * np.exp(-_t / 30), 0.2, 100, 300), False),
        (_signed(-4.0 + 13.0 * np.exp(-_t / 10), 0.2, 100, 301), False),
        # a zig-zag the size of the noise is not an oscillation (the old ratio: ±1810 %)
        (_signed(0.01 * _zz, 0.01, 100, 500), False),
        # the real faults: a loss around 0 bouncing between two levels ±3 noise σ apart
        (_signed(0.03 * _zz, 0.01, 100, 400), True),
        (_signed(0.03 * _blocks, 0.01, 100, 601), True),
        (_signed(np.linspace(1.0, -1.0, 100) + 0.6 * _zz, 0.2, 100, 701), True),  # while falling through 0
        (_signed(-0.5 + 0.3 * np.sin(2 * np.pi * _t / 25), 0.1, 100, 802), True),  # a cycle below 0
        (_signed(-2.0 + 0.6 * _zz, 0.2, 100, 900), True),
        # and a positive loss still by its level: ±40 % of 0.05
        (list(0.05 * (1.0 + 0.4 * _zz)), True),
    ],
)
def test_oscillation_of_a_loss_that_crosses_zero(values: list[float], fires: bool) -> None:
    v = DETECTORS["oscillation"].fn(win(values), OscillationParams(**_OSC), ctx())
    assert v is not None and v.firing is fires, v


def test_oscillation_of_a_signed_loss_names_its_noise() -> None:
    v = DETECTORS["oscillation"].fn(win(_signed(0.03 * _zz, 0.01, 100, 400)), OscillationParams(**_OSC), ctx())
    assert v is not None and v.firing and v.detail.startswith("±0.04")
    assert "× its noise" in v.detail and "correlated from step to step" in v.detail


@pytest.mark.parametrize(
    "values",
    [sgd_loss(100, rel=0.1, tau=200), list(1.0 + 0.4 * _zz), list(0.3 + 2.0 * np.exp(-_t / 20))],
)
def test_oscillation_of_a_positive_loss_ignores_noise(values: list[float]) -> None:
    by_level = DETECTORS["oscillation"].fn(win(values), OscillationParams(**_OSC, noise=0.0), ctx())
    assert DETECTORS["oscillation"].fn(win(values), OscillationParams(**_OSC), ctx()) == by_level


def test_oscillation_of_a_signed_loss_falling_fast_is_vetoed_by_its_level() -> None:
    values = _signed(-4.0 + 13.0 * np.exp(-_t / 30), 0.2, 100, 300)
    v = DETECTORS["oscillation"].fn(win(values), OscillationParams(**_OSC), ctx())
    assert v is not None and v.value > 0.3 and not v.firing and "level moved -7.1" in v.detail
    unguarded = DETECTORS["oscillation"].fn(win(values), OscillationParams(**_OSC, max_trend=0.0), ctx())
    assert unguarded is not None and unguarded.firing


def test_oscillation_noise_zero_keeps_the_ratio_to_the_mean() -> None:
    values = _rollouts(np.linspace(-0.008, 0.006, 100), 0.01, 0.006, 100, 13)
    assert fires("oscillation", win(values), OscillationParams(**_OSC, noise=0.0), ctx()) is True


@pytest.mark.parametrize(
    ("rho", "fraction"),
    [([], 1.0), ([0.0] * 5, 1.0), ([-0.9], 0.19), ([-0.9, 0.81, -0.729], 0.19), ([0.5, 0.5], 0.75 * (1 - 1 / 9))],
)
def test_unpredictable_fraction(rho: list[float], fraction: float) -> None:
    assert unpredictable_fraction(rho) == pytest.approx(fraction)


# -- forecast -------------------------------------------------------------------------

GB = 1e9
_FC: dict[str, Any] = {"ratio": 0.9, "horizon_seconds": 600.0, "window": 60, "min_samples": 12, "min_ratio": 0.5}


@pytest.mark.parametrize(
    ("values", "capacity", "fires"),
    [
        ([9.5 * GB], 10 * GB, True),  # the seeds: peak > 90 % of capacity
        ([5.0 * GB] * 60, 10 * GB, False),
        (list(np.linspace(6.0, 8.5, 60) * GB), 10 * GB, True),  # a leak: full in ~ a minute
        (list(np.linspace(6.0, 6.06, 60) * GB), 10 * GB, False),  # slow: full in hours
        (list(np.linspace(1.0, 3.0, 60) * GB), 10 * GB, False),  # below min_ratio
        ([2.0 * GB] * 30 + [7.0 * GB] * 30, 10 * GB, False),  # one step (Adam state): no trend
        ([8.0 * GB] * 60, 10 * GB, False),
    ],
)
def test_forecast(values: list[float], capacity: float, fires: bool) -> None:
    v = DETECTORS["forecast"].fn(win(values), ForecastParams(**_FC), ctx(reference=capacity))
    assert v is not None and v.firing is fires


def test_forecast_does_not_extrapolate_a_small_creep_far() -> None:
    creep = win(list(np.linspace(6.0, 6.1, 60) * GB), dt=0.05)  # +1.6 % in 3 s of a fast run
    c = ctx(reference=10 * GB)
    assert fires("forecast", creep, ForecastParams(**_FC), c) is False
    assert fires("forecast", creep, ForecastParams(**_FC, max_extrapolation=100.0), c) is True


def test_forecast_needs_capacity() -> None:
    assert DETECTORS["forecast"].fn(win([9.9 * GB]), ForecastParams(), ctx()) is None
    assert DETECTORS["forecast"].fn(win([9.9 * GB]), ForecastParams(), ctx(reference=0.0)) is None


# -- plateau --------------------------------------------------------------------------

_PL: dict[str, Any] = {"window": 500, "chunk": 100, "min_delta": 0.01}


@pytest.mark.parametrize(
    ("values", "fires"),
    [
        (sgd_loss(500, tau=300), False),
        (noisy(0.7, 0.02, 500), True),
        (noisy(0.7, 0.08, 300) + list(np.linspace(0.7, 1.0, 200)), True),  # got worse
    ],
)
def test_plateau(values: list[float], fires: bool) -> None:
    v = DETECTORS["plateau"].fn(win(values), PlateauParams(**_PL), ctx())
    assert v is not None and v.firing is fires


def test_plateau_needs_full_window_since_lr_change() -> None:
    values = noisy(0.7, 0.08, 500)
    p = PlateauParams(**_PL)
    assert DETECTORS["plateau"].fn(win(values[:400]), p, ctx()) is None
    assert DETECTORS["plateau"].fn(win(values), p, ctx(since_step=100)) is None


# -- drop (AMP loss scale) ------------------------------------------------------------

_DROP: dict[str, Any] = {"window": 200, "factor": 16.0, "floor": 1.0}


@pytest.mark.parametrize(
    ("values", "fires"),
    [
        ([65536.0] * 100, False),
        ([65536.0] * 100 + [32768.0] * 50, False),  # one normal overflow halves the scale
        ([65536.0] * 50 + [32768.0] * 50 + [65536.0] * 50 + [32768.0] * 50, False),
        ([65536.0] * 50 + [65536.0 / 2**k for k in range(1, 6)], True),  # keeps halving
        ([4.0] * 10 + [0.5], True),  # below the floor
    ],
)
def test_drop(values: list[float], fires: bool) -> None:
    v = DETECTORS["drop"].fn(win(values), DropParams(**_DROP), ctx())
    assert v is not None and v.firing is fires


def test_drop_ignores_the_scalers_calibration_in_warmup() -> None:
    # GradScaler starts at 65536 and halves until it fits, in the first steps
    values = [65536.0 / 2**k for k in range(8)] + [512.0] * 200
    p = DropParams(**_DROP)
    assert fires("drop", win(values[:60]), p, ctx()) is True
    assert fires("drop", win(values[:60]), p, ctx(since_step=50)) is False
    assert fires("drop", win(values[:60]), DropParams(**_DROP, after_step=50), ctx()) is False


def test_drop_floor_holds_before_after_step() -> None:
    # every step overflows from the start: the scale halves below 1 within the calibration
    values = [65536.0 / 2**k for k in range(20)]
    assert fires("drop", win(values), DropParams(**_DROP, after_step=100), ctx()) is True


# -- stall ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dt", "silence", "params", "fires"),
    [
        (1.0, 30.0, {"min_seconds": 60, "factor": 20}, False),
        (1.0, 61.0, {"min_seconds": 60, "factor": 20}, True),
        (10.0, 150.0, {"min_seconds": 60, "factor": 20}, False),  # slow steps: 20 × 10 s
        (10.0, 210.0, {"min_seconds": 60, "factor": 20}, True),
    ],
)
def test_stall(dt: float, silence: float, params: dict[str, Any], fires: bool) -> None:
    w = win(list(range(50)), dt=dt)
    v = DETECTORS["stall"].fn(w, StallParams(**params), ctx(now=float(w.times[-1]) + silence))
    assert v is not None and v.firing is fires
    assert v.value == pytest.approx(silence)


def test_stall_with_one_frame_uses_min_seconds() -> None:
    v = DETECTORS["stall"].fn(win([0.0]), StallParams(min_seconds=5), ctx(now=6.0))
    assert v is not None and v.firing and v.threshold == 5


@pytest.mark.parametrize(("heartbeat", "fires", "value", "detail"), [
    (None, True, 100.0, "no step for 100 s (limit 60 s)"),
    (80.0, True, 69.0, "no step for 100 s, the run's last heartbeat 69 s ago (limit 60 s)"),  # a hang after it
    (100.0, False, 49.0, "no step for 100 s, the run's last heartbeat 49 s ago (limit 60 s)"),
    (40.0, True, 100.0, "no step for 100 s (limit 60 s)"),  # an old heartbeat, before the last step
])
def test_stall_counts_from_the_later_of_the_last_step_and_the_last_heartbeat(
        heartbeat: float | None, fires: bool, value: float, detail: str) -> None:
    w = win(list(range(50)))  # the last step at t = 49
    v = DETECTORS["stall"].fn(w, StallParams(min_seconds=60), ctx(now=149.0, heartbeat=heartbeat))
    assert v is not None and (v.firing, v.value) == (fires, value) and detail in v.detail


# -- helpers --------------------------------------------------------------------------


def test_helpers() -> None:
    w = win([1.0, 2.0, 3.0, 4.0], start=10)
    assert list(since(w, 12).values) == [3.0, 4.0]
    assert since(w, 0) is w
    assert quantile([0.0, 10.0], 0.5) == 5.0
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert finite([1.0, math.nan, math.inf, 2.0]) == [1.0, 2.0]


# -- exited ---------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "fires", "words"), [
    (137, True, "killed by SIGKILL (signal 9): the kernel's OOM killer"),
    (139, True, "killed by SIGSEGV (signal 11)"),
    (143, True, "killed by SIGTERM (signal 15): the scheduler"),
    (130, True, "killed by SIGINT (signal 2): interrupted: Ctrl-C"),
    (129, True, "killed by SIGHUP (signal 1): its terminal closed"),
    (1, True, "exited with status 1"),
    (-1, True, "exit status unknown"),
    (0, False, "running again"),
])  # fmt: skip
def test_exited_says_how_the_process_ended(status: int, fires: bool, words: str) -> None:
    from sentinel.rules.exited import ExitedParams

    v = DETECTORS["exited"].fn(win([float(status)]), ExitedParams(), Context(step=5, now=0.0, note="last values: x"))
    assert v is not None and v.firing is fires and words in v.detail
    assert ("last values: x" in v.detail) is fires


def test_exited_ignores_configured_codes() -> None:
    from sentinel.rules.exited import ExitedParams

    v = DETECTORS["exited"].fn(win([3.0]), ExitedParams(ignore_codes=[3]), Context(step=5, now=0.0))
    assert v is not None and not v.firing


# -- spike: the quiet() shortcut never hides a spike ------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.one_of(st.floats(0.01, 100.0), st.just(math.nan), st.floats(1e3, 1e6)), min_size=30, max_size=90),
    ahead=st.integers(1, 25),
    factor=st.floats(1.5, 20.0),
)
def test_spike_quiet_never_hides_a_firing_verdict(values: list[float], ahead: int, factor: float) -> None:
    """What detect() leaves in the memo lets quiet() answer for later samples without the
    window; whenever quiet() says "cannot fire", a full evaluation agrees."""
    from sentinel.rules.spike import quiet

    p = SpikeParams(window=20, min_samples=5, factor=factor, z=3.0)
    j = len(values) - ahead - 1
    if j < 6:
        return
    memo: dict[str, Any] = {}
    detect = DETECTORS["spike"].fn
    detect(win(values[: j + 1]), p, Context(step=j, now=0.0, memo=memo))
    memo["count"] = j + 1  # as the engine's full verdict leaves it
    later = detect(win(values), p, Context(step=len(values) - 1, now=0.0))
    if quiet(values[-1], p, memo, ahead):
        assert later is None or not later.firing


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.one_of(st.floats(0.5, 2.0), st.floats(5.0, 50.0), st.just(0.0), st.just(math.nan),
                              st.just(math.inf)), min_size=40, max_size=120),
    factor=st.floats(1.5, 5.0),
    min_value=st.sampled_from([-math.inf, 3.0]),
)
def test_spike_quiet_from_one_sample_to_the_next_is_exact(values: list[float], factor: float,
                                                           min_value: float) -> None:
    """Carried from each sample to the next as the engine carries it (a full verdict renews
    the memo whenever quiet() defers), quiet() answers exactly: "quiet" where detect() gives
    no verdict or one under its threshold, "judge in full" where the value reaches it (that
    of the samples above 0 when the baseline rests at 0)."""
    from sentinel.rules.spike import quiet

    p = SpikeParams(window=20, min_samples=5, factor=factor, z=3.0, min_value=min_value)
    detect = DETECTORS["spike"].fn
    memo: dict[str, Any] = {}
    for n in range(8, len(values) + 1):
        full = detect(win(values[:n]), p, Context(step=n - 1, now=0.0))
        if memo.get("base") and quiet(values[n - 1], p, memo, 1):
            assert full is None or full.value < full.threshold
            continue
        if memo.get("base"):  # deferred: the value reaches the threshold
            assert full is not None and full.value >= full.threshold
        memo.pop("base", None)  # as the engine's full verdict does
        memo["count"] = n
        again = detect(win(values[:n]), p, Context(step=n - 1, now=0.0, memo=memo))
        assert again == full


def test_spike_quiet_answers_for_a_steady_series_and_defers_near_the_threshold() -> None:
    """The shortcut does engage (that is its point): a value near the baseline is quiet for
    a few samples after a full evaluation; one near factor x baseline is not."""
    from sentinel.rules.spike import quiet

    p = SpikeParams(window=20, min_samples=5, factor=3.0, z=3.0)
    memo: dict[str, Any] = {}
    values = [1.0 + 0.01 * (i % 5) for i in range(30)]
    DETECTORS["spike"].fn(win(values), p, Context(step=29, now=0.0, memo=memo))
    memo["count"] = 30
    assert quiet(1.02, p, memo, 1) and quiet(1.02, p, memo, 5)
    assert not quiet(3.5, p, memo, 1)  # past 3x the baseline: only a full evaluation can tell
    assert not quiet(1.02, p, memo, 20)  # the old baseline says nothing any more


@pytest.mark.parametrize(("counts", "min_consecutive", "fires"),
                         [([0, 1], 1, True), ([1, 0], 1, False), ([1, 2], 3, False), ([1, 2, 3], 3, True)])
def test_skip_fires_on_skips_in_a_row(counts: list[float], min_consecutive: int, fires: bool) -> None:
    """The step guard's rules (StepSkipped: 1, StepsSkippedRepeatedly: 3)."""
    from sentinel.rules import skip

    w = Window(np.arange(len(counts)), np.arange(len(counts), dtype=float), np.array(counts, dtype=float))
    v = skip.detect(w, skip.SkipParams(min_consecutive=min_consecutive),
                    Context(step=len(counts), now=0.0, note="step 9 skipped (spike)"))
    assert v is not None and v.firing is fires
    assert v.detail == ("step 9 skipped (spike)" if fires else "")
