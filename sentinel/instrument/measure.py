"""What a monitor measures per optimizer step: the gradients, the update, the parameters,
the clip, and the sums the step guard judges. Each figure is a tensor on its device, kept
by segment name until the step's report closes (read back with it, never here)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from sentinel.instrument import loaders, probes
from sentinel.instrument.boundary import Boundary
from sentinel.instrument.cadence import Cadence
from sentinel.instrument.frames import Report, Segs
from sentinel.instrument.layout import Layout
from sentinel.instrument.stats import device_index
from sentinel.instrument.timing import BusyClock, Heartbeat

GradRead = tuple[dict[torch.device, torch.Tensor], dict[torch.device, torch.Tensor], int]
"""The gradients' sums of squares and L1 sums per device, and how many elements the L1 sums took."""


class HandUpdated:
    """The parameters of a script that updates them by hand, as the one param group the
    layout groups them by (never stepped, never described as an optimizer)."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.param_groups = [{"params": list(params)}]


class Measure:
    """The step's device-side figures, by segment name, until its report closes.

    Args:
        boundary: the monitor's boundary (the guard's judgement runs inside it).
        cadence: which steps read the gradients' L1 sums.
        optimizers: the monitor's optimizers (its own list: a re-created one replaces its place).
        memory_capacity_bytes: the memory a job may use, when a config gives it (0: none).
        ddp: the model is wrapped in DistributedDataParallel (said in each step's frame).

    Attributes:
        layout: the current groups and tensors (the monitor sets it at each new layout).
        busy: the model's busy clock (data loading and forward compute per step), or None.
        heartbeat: the rank's sign of life between steps (wound up at each step), or None.
        guard: the step guard that judges each step's gradients, or None.
        hand_read: a ``backward()``'s gradients (parameters updated by hand) were read, their
            step not ended yet.
    """

    layout: Layout

    def __init__(self, boundary: Boundary, cadence: Cadence, optimizers: list[torch.optim.Optimizer],
                 memory_capacity_bytes: int, ddp: bool = False) -> None:
        self.boundary, self.cadence, self.optimizers = boundary, cadence, optimizers
        self.capacity, self.ddp = memory_capacity_bytes, ddp
        self.busy: BusyClock | None = None
        self.heartbeat: Heartbeat | None = None
        self.last_step_time: float | None = None
        self.guard: Any = None  # sentinel.instrument.guard.Guard or None
        self.hand_read = False
        self.segs: Segs = {}
        self.grad_count = 0
        self.clip_max: float | None = None
        self.meta_groups: set[int] = set()
        self.gradless = False  # an optimizer of this step had no gradient on any parameter that wants one
        self.gradless_run = 0  # steps in a row with such an optimizer

    def add(self, name: str, per_device: dict[torch.device, torch.Tensor]) -> None:
        """Add ``per_device`` to the step's segment ``name`` (summed with what it holds)."""
        for dev, t in per_device.items():
            segs = self.segs.setdefault(dev, {})
            segs[name] = segs[name] + t if name in segs else t

    def grad_read(self, k: int, step: int) -> GradRead:
        """Optimizer ``k``'s gradient sums (and, when due, their L1 sums), not added yet."""
        grouped = self.layout.tensors[k]
        sums, l1, count = grouped.grad_sums(l1=self.cadence.health_due(step))
        if not sums:  # read, and no parameter has a gradient: a norm of 0, said so
            sums = {torch.device("cpu"): torch.zeros(max(1, grouped.n_groups))}
            params = [p for g in self.optimizers[k].param_groups for p in g["params"]]
            if any(p.requires_grad for p in params) and all(p.grad is None for p in params):
                self.gradless = True  # it steps parameters the loss never reached
        return sums, l1, count

    def grad_stats(self, k: int, step: int, read: GradRead | None = None) -> dict[torch.device, torch.Tensor]:
        """Add optimizer ``k``'s gradient sums (``read`` when they were read already); the sums."""
        sums, l1, count = self.grad_read(k, step) if read is None else read
        self.add("grad_sumsq", sums)
        if count:
            self.add("grad_l1", {d: t.sum().reshape(1) for d, t in l1.items()})
            self.grad_count += count
        return sums

    def guard_grads(self, k: int, step: int, sums: dict[torch.device, torch.Tensor] | None) -> None:
        """The guard judges the step from the sums just read (issue 21)."""
        if self.guard is not None and sums is not None:
            clip_norm = next((s["clip_norm"] for s in self.segs.values() if "clip_norm" in s), None)
            self.boundary.run("guard", self.guard.after_grads, k, self.optimizers[k], step, sums, clip_norm)

    def update_stats(self, k: int) -> None:
        snap = self.layout.snapshots[k]
        for name, sums in snap.measure().items():  # ‖Δw‖ and the seed's UAR (deltas.py)
            self.add(name, sums)
        self.meta_groups |= snap.groups

    def param_stats(self, k: int) -> None:
        self.add("param_sumsq", self.layout.tensors[k].param_sumsq())

    def note_clip(self, total_norm: torch.Tensor, max_norm: float) -> None:
        for segs in self.segs.values():  # clipped twice before a step: the last one counts
            segs.pop("clip_norm", None)
        t = total_norm.detach().reshape(1).to(torch.float32)
        if self.hand_read:  # read at backward(), before this clip: scale as torch scaled the gradients
            coef = torch.clamp(float(max_norm) / (t + 1e-6), max=1.0).square()
            for segs in self.segs.values():
                if "grad_sumsq" in segs:
                    segs["grad_sumsq"] = segs["grad_sumsq"] * coef.to(segs["grad_sumsq"].device)
        self.segs.setdefault(t.device, {})["clip_norm"] = t
        self.clip_max = float(max_norm)

    def replay(self, params: Sequence[torch.Tensor], norms: torch.Tensor) -> None:
        """The gradient sums of a step taken before this monitor existed, from the norms
        taken right after its ``backward()`` (``norms``, per parameter, on the device)."""
        grouped = self.layout.tensors[0]
        group_of = {id(p): g for b in grouped.buckets.values() for p, g in zip(b.params, b.groups)}
        pos = [(i, group_of[id(p)]) for i, p in enumerate(params) if id(p) in group_of]
        if pos:
            vec = torch.zeros(max(1, grouped.n_groups), dtype=torch.float32, device=norms.device)
            idx = device_index([g for _, g in pos], norms.device)
            picked = norms.index_select(0, device_index([i for i, _ in pos], norms.device))
            vec.index_add_(0, idx, picked.to(torch.float32).square())
            self.add("grad_sumsq", {norms.device: vec})

    def close_step(self, report: Report) -> None:
        """Put the step's host-side figures into its report (the schedules' peaks, the step's
        time and busy time, the gradients read, the clip's max, the groups whose update was
        sampled) and start counting the next step's."""
        frame = report.frame
        peaks = probes.schedule_peaks(self.optimizers)
        if peaks is not None:
            frame.lr_peak = peaks
        now = time.monotonic()  # not the wall clock, which an NTP step or a resumed VM sets back
        if self.last_step_time is not None:
            frame.step_seconds = now - self.last_step_time
        self.last_step_time = now
        busy = self.busy.step_done() if self.busy is not None else None
        if self.heartbeat is not None:
            self.heartbeat.stepped()
        if busy is not None:
            frame.busy_seconds = busy
        if self.ddp:
            frame.ddp = True
        if self.grad_count:
            frame.grad_count, self.grad_count = self.grad_count, 0
        short = loaders.short_batch()
        if short is not None:  # the epoch's short last batch: no spike to judge in its values
            frame.short_batch = short
        if self.clip_max is not None:
            frame.clip_max, self.clip_max = self.clip_max, None
        if self.meta_groups:
            report.delta_groups = sorted(self.meta_groups)
            self.meta_groups = set()
        if self.gradless or self.gradless_run:  # while it lasts, and the 0 that ends it
            self.gradless_run = self.gradless_run + 1 if self.gradless else 0
            frame.no_gradient, self.gradless = self.gradless_run, False

    def take(self) -> Segs:
        """The step's segments; the next step's start empty."""
        segs, self.segs = self.segs, {}
        return segs

    def memory(self) -> dict[str, float]:
        """The host's and the layout's devices' memory figures."""
        mem = probes.host_memory()
        devices = self.layout.devices
        if any(d.type == "cuda" for d in devices):
            mem.update(probes.cuda_memory(devices))
        if self.capacity > 0:
            mem["capacity"] = float(self.capacity)
        return mem
