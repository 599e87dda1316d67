"""What a report carries at the first step, after a ``load_state_dict`` and every
``state_every`` steps: the optimizers' record (class and hyperparameters), the environment,
the optimizer-state bytes, Adam's sampled state saturation and each optimizer's own health
figure (optstate.py), LAMB's per-group trust ratios included.

Host-side reads of metadata, and sampled counts left on the device for the report's
readback; nothing is read back here. Each read runs under the monitor's boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from sentinel.instrument import envprobe, optinfo, optstate, probes
from sentinel.instrument.boundary import Boundary
from sentinel.instrument.frames import Report
from sentinel.instrument.layout import Layout
from sentinel.instrument.options import WatchOptions
from sentinel.instrument.stats import adam_saturation

Add = Callable[[str, dict[torch.device, torch.Tensor]], None]


class StateRecord:
    """The rotating cursors of the sampled figures, and when the record is due."""

    def __init__(self, boundary: Boundary, options: WatchOptions) -> None:
        self.boundary = boundary
        self.options = options
        self.due = True  # the first step; set again after load_state_dict and a new layout
        self._sat_cursor = 0
        self._health_cursor = 0
        # the highest lr each param group has been at since the optimizer's state began (the
        # order of probes.learning_rates): a schedule written by hand sets group["lr"] itself
        self._top: list[float] = []

    def restart(self) -> None:
        """The optimizer loaded a state (a resume, an LR finder's reset): record it again,
        and its peak lr from here (a range test's lr of 10 was no setting of the run's)."""
        self.due = True
        self._top = []

    def add_to(self, report: Report, add: Add, step: int, optimizers: Sequence[torch.optim.Optimizer],
               layout: Layout, devices: Sequence[torch.device], lrs: Sequence[float] = ()) -> None:
        """Put the record into the report's frame (and its device counts through ``add``) when
        due; ``lrs`` are the step's learning rates, each group's (``Cadence.lrs``)."""
        o = self.options
        top = self._top
        if len(top) != len(lrs):  # the first step, or a group added: from here
            self._top = list(lrs)
        elif lrs != top:  # a constant lr costs one comparison a step
            self._top = [b if b > a or a != a else a for a, b in zip(top, lrs)]  # NaN: a tensor lr unread
        if not (self.due or step % o.state_every == 0):
            return
        self.due = False
        frame = report.frame
        optim = self.boundary.run("optimizer", optinfo.describe, optimizers, self._top)
        if optim:
            frame.optim = optim
            if o.total_steps > 0:
                frame.total_steps = o.total_steps
        env = self.boundary.run("environment", envprobe.describe, devices)
        if env:  # at the first step, after a load, and every state_every steps (a restarted daemon)
            frame.env = env
        st = self.boundary.run("state", probes.state_bytes, optimizers)
        if st is not None and optimizers:  # parameters updated by hand: no state to speak of
            frame.state_bytes = st
            frame.param_bytes = layout.param_bytes
        sat = self.boundary.run("saturation", adam_saturation, optstate.adam_like(optimizers),
                             o.saturation_threshold, o.saturation_max_tensors, self._sat_cursor)
        if sat is not None and sat[1]:
            add("sat_above", sat[0])
            report.sat_total, self._sat_cursor = sat[1], sat[2]
        self.boundary.run("opt_health", self._optimizer_health, report, add, optimizers, layout)

    def _optimizer_health(self, report: Report, add: Add, optimizers: Sequence[torch.optim.Optimizer],
                          layout: Layout) -> None:
        """Each optimizer's own health figure and LAMB's trust ratios (optstate.py)."""
        o = self.options
        nums, totals, self._health_cursor = optstate.health(
            optimizers, o.saturation_threshold, o.saturation_max_tensors, self._health_cursor)
        for name, per in nums.items():
            add(f"h:{name}", per)
        if totals:
            report.health_total = totals
        counts: list[int] = []
        for k, opt in enumerate(optimizers):
            if type(opt).__name__.lower() != "lamb":
                continue
            tensors = layout.tensors[k]
            group_of = {id(p): g for b in tensors.buckets.values() for p, g in zip(b.params, b.groups)}
            sums, cnt = optstate.trust_ratios(opt, group_of, len(layout.groups))
            if any(cnt):
                add("trust_sum", sums)
                counts = [a + b for a, b in zip(counts, cnt)] if counts else cnt
        if counts:
            report.trust_count = counts
