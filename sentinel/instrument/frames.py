"""A report's frame: the host-side fields a step or a ``log()`` set on its
:class:`~sentinel.wire.Frame`, completed with the values read back from the device (see
:mod:`sentinel.wire` for the fields)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sentinel.instrument.scalars import means
from sentinel.wire import UNSET, Amp, Frame

Segs = dict[torch.device, dict[str, torch.Tensor]]
"""A report's device-side figures: per device, the tensors by segment name (``grad_sumsq``, ...)."""


@dataclass
class Report:
    """A report waiting for its readback: its frame, with the host-side fields set, and the
    host-side halves of the figures whose other half is on the device.

    Attributes:
        frame: the frame being built (identity, ``groups``, ``lr``, ``optim``, ``mem``, ...).
        delta_groups: the groups whose update was sampled this step (``delta_*`` per group).
        sat_total: the sampled ``exp_avg_sq`` count (``sat``'s total; above it on the device).
        health_total: per optimizer figure, its sampled total (``opt_health``'s totals).
        trust_count: per group, LAMB parameters in it (``trust_ratio``'s divisors).
        scalars: ``{name: [host sum, count]}`` (:meth:`~sentinel.instrument.scalars.Scalars.meta`).
        unless_skipped: a report only of passes thrown away (``skipped``): sent only when
            some had a non-finite loss.
    """

    frame: Frame
    delta_groups: list[int] | None = None
    sat_total: float | None = None
    health_total: dict[str, int] | None = None
    trust_count: list[int] | None = None
    scalars: dict[str, list[float]] | None = None
    unless_skipped: bool = False


def assemble(report: Report, values: dict[str, list[float]], n_groups: int, sharded: bool) -> Frame:
    """The frame of one report, completed with the read-back ``values``: the one place where
    a frame's device-side fields are set.

    Args:
        report: the report's frame and host-side halves.
        values: device values by segment name, as :class:`~sentinel.instrument.readback.Readback`
            returns them (``grad_sumsq``, ``s:<scalar>``, ``amp_scale``, ...).
        n_groups: the number of groups, for a step frame whose gradients were all missing.
        sharded: whether the sums are of local shards.
    """
    frame = report.frame
    if values.get("amp_scale"):
        frame.amp = Amp(scale=values["amp_scale"][0])
    if report.scalars is not None:
        frame.scalars = means(report.scalars, values)
    if values.get("skipped") and values["skipped"][0] > 0:  # losses.LossSum.skipped, a running count
        frame.skipped_nonfinite = int(values["skipped"][0])
    if frame.kind != "step":
        return frame
    g = n_groups
    if "grad_sumsq" in values:  # absent: the probe failed (never a made-up 0)
        frame.grad_sumsq = values["grad_sumsq"]
    if "param_sumsq" in values:
        frame.param_sumsq = values["param_sumsq"]
    if "delta_sumsq" in values:
        sampled = set(report.delta_groups or ())
        frame.delta_sumsq = [v if i in sampled else None for i, v in enumerate(values["delta_sumsq"])]
        # the seed's UAR (instrument/deltas.py)
        if "delta_l1" in values and len(values["delta_l1"]) == g:
            frame.delta_l1 = [v if i in sampled else None for i, v in enumerate(values["delta_l1"])]
        if "param_l1" in values and len(values["param_l1"]) == g:
            frame.param_l1 = [v if i in sampled else None for i, v in enumerate(values["param_l1"])]
    if "carried" in values:  # instrument/resets.py: this step's gradients began from the last step's
        frame.not_reset = 1 if values["carried"][0] > 0 else 0
    if "grad_l1" in values and frame.grad_count is not UNSET:
        frame.grad_l1 = values["grad_l1"][0]
    if "sat_above" in values and report.sat_total is not None:
        frame.sat = [values["sat_above"][0], report.sat_total]
    if report.health_total:  # optstate.py's figures: [numerator, total]
        health = {n: [values[f"h:{n}"][0], t] for n, t in report.health_total.items() if values.get(f"h:{n}")}
        if health:
            frame.opt_health = health
    counts, sums = report.trust_count, values.get("trust_sum")  # LAMB's trust ratio per group
    if counts and sums and len(sums) == len(counts):
        frame.trust_ratio = [s / c if c else None for s, c in zip(sums, counts)]
    if values.get("clip_norm") and frame.clip_max is not UNSET:
        frame.clip_norm = values["clip_norm"][0]
    else:
        frame.clip_max = UNSET  # the max without the norm it clipped means nothing
    frame.shard = "sharded" if sharded else "replicated"
    return frame

