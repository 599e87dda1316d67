"""The one registry of detector kinds: ``kind`` in a rule → pure function + parameter model."""

from __future__ import annotations

from sentinel.rules import (
    band,
    collapse,
    divergence,
    drop,
    early,
    exited,
    forecast,
    nonfinite,
    oscillation,
    plateau,
    scheduled,
    skip,
    spike,
    stall,
    threshold,
    trend,
)
from sentinel.rules.base import DetectorSpec

DETECTORS: dict[str, DetectorSpec] = {
    "threshold": DetectorSpec(threshold.detect, threshold.ThresholdParams, idle=threshold.idle),
    "band": DetectorSpec(band.detect, band.BandParams),
    "nonfinite": DetectorSpec(nonfinite.detect, nonfinite.NonFiniteParams, idle=nonfinite.idle),
    "spike": DetectorSpec(spike.detect, spike.SpikeParams, quiet=spike.quiet),
    "divergence": DetectorSpec(divergence.detect, divergence.DivergenceParams, memo=True),
    "collapse": DetectorSpec(collapse.detect, collapse.CollapseParams),
    "oscillation": DetectorSpec(oscillation.detect, oscillation.OscillationParams),
    "plateau": DetectorSpec(plateau.detect, plateau.PlateauParams),
    "scheduled": DetectorSpec(scheduled.detect, scheduled.ScheduledParams),
    "forecast": DetectorSpec(forecast.detect, forecast.ForecastParams),
    "drop": DetectorSpec(drop.detect, drop.DropParams),
    "early": DetectorSpec(early.detect, early.EarlyParams),
    "skip": DetectorSpec(skip.detect, skip.SkipParams, idle=skip.idle),
    "stall": DetectorSpec(stall.detect, stall.StallParams, time_based=True),
    "exited": DetectorSpec(exited.detect, exited.ExitedParams),
    "trend": DetectorSpec(trend.detect, trend.TrendParams, quiet=trend.quiet),
}
"""Every detector kind a rule may name."""
