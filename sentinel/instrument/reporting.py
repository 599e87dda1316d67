"""How a monitor's reports leave it: read back from the device, framed, sent; and what
the engine says back (alerts, the stop and capture actions)."""

from __future__ import annotations

from typing import Any, Literal

import torch

from sentinel import wire
from sentinel.instrument import probes, registry
from sentinel.instrument.capture import InputCapture
from sentinel.instrument.frames import Report, assemble
from sentinel.instrument.boundary import Boundary
from sentinel.instrument.options import WatchOptions
from sentinel.instrument.readback import Readback
from sentinel.instrument.scalars import NameBudget, Scalars
from sentinel.instrument.sender import Sender

Segs = dict[torch.device, dict[str, torch.Tensor]]


class Reporter:
    """The sending half of :class:`~sentinel.instrument.monitor.Monitor` (a mixin)."""

    options: WatchOptions
    boundary: Boundary
    sender: Sender
    engine: Any
    scaler: Any
    groups: list[str]
    sharded: bool
    devices: list[torch.device]
    rank: int
    world: int
    optimizers: list[Any]
    stream: str | None
    on_alert: list[Any]
    capture: InputCapture
    guard: Any  # the step guard (sentinel.instrument.guard.Guard) or None
    _open: tuple[Report, Segs, Scalars] | None
    _readback: Readback
    _names: NameBudget
    _report_drops: int

    def request_stop(self, reason: str) -> None:
        raise NotImplementedError  # the monitor's

    @property
    def frames_dropped(self) -> int:
        return self.sender.dropped + self._report_drops

    def _submit_open(self) -> None:
        """Start the readback of the finalized report (with any scalars log() added)."""
        if self._open is None:
            return
        (report, segs, scalars), self._open = self._open, None
        self._submit(report, segs, scalars)

    def _frame(self, kind: Literal["step", "log", "bye"], step: int, t: float) -> wire.Frame:
        """A new frame of this process (its identity is set again as it leaves)."""
        o = self.options
        return wire.Frame(kind=kind, job=o.job, run=o.run, rank=self.rank, world=self.world, step=step, t=t)

    def _submit(self, report: Report, segs: Segs, scalars: Scalars) -> None:
        if scalars:
            report.scalars = scalars.meta()
            for dev, named in scalars.segments().items():
                segs.setdefault(dev, {}).update(named)
        if self._names.dropped:
            report.frame.scalars_dropped = self._names.dropped
        self._add_amp_scale(segs)
        self._readback.submit(report, segs)
        self._emit_ready(False)

    def _add_amp_scale(self, segs: Segs) -> None:
        """The GradScaler's scale tensor, read back with the report (``get_scale()`` would sync)."""
        scale = getattr(self.scaler, "_scale", None)
        if isinstance(scale, torch.Tensor) and getattr(self.scaler, "_enabled", True):
            segs.setdefault(scale.device, {})["amp_scale"] = scale.detach().reshape(1).to(torch.float32)

    def _memory(self) -> dict[str, float]:
        mem = probes.host_memory()
        if any(d.type == "cuda" for d in self.devices):
            mem.update(probes.cuda_memory(self.devices))
        if self.options.memory_capacity_bytes > 0:
            mem["capacity"] = float(self.options.memory_capacity_bytes)
        return mem

    # -- emission -------------------------------------------------------------------------

    def _emit_ready(self, wait: bool) -> None:
        ready = self._readback.poll(wait)
        if ready and self.guard is not None:  # the guard's notes of these steps go first (issue 21)
            steps = [int(r.frame.step) for r, _ in ready if r.frame.kind == "step"]
            if steps:
                self.boundary.run("guard", self.guard.notes_upto, max(steps))
        for report, values in ready:
            self.boundary.run("emit", self._emit, report, values)

    def _emit(self, report: Report, values: dict[str, list[float]]) -> None:
        frame = assemble(report, values, len(self.groups), self.sharded)
        frame.errors = self.boundary.errors
        frame.dropped = self.frames_dropped
        self._send(frame)

    def _send(self, frame: wire.Frame | dict[str, Any]) -> None:
        """Send a frame (a map: the step guard's notes) as this process's."""
        o = self.options
        if self.stream is None:  # decided once, at the first report
            self.stream = registry.stream_label(self) if self.optimizers else ""
        reply = getattr(self.engine, "reply_path", None)  # a shared daemon's way back to us
        if isinstance(frame, wire.Frame):
            frame.job, frame.run, frame.rank, frame.world = o.job, o.run, self.rank, self.world
            if self.stream:
                frame.opt = self.stream
            if reply and frame.kind == "step":
                frame.reply = reply
        else:
            frame.update(job=o.job, run=o.run, rank=self.rank, world=self.world)
            if self.stream:
                frame["opt"] = self.stream
        self.sender.send(wire.encode(frame))

    def _count_drop(self) -> None:
        self._report_drops += 1

    def _messages(self) -> None:
        """Act on what the engine said: alert callbacks, the stop action, and the capture
        action's ``arm`` and ``capture`` (training thread)."""
        if self.engine is None:
            return
        for msg in self.engine.poll():  # maps decoded and checked by wire.decode_message
            if msg.get("kind") == "stop":
                self.request_stop(str(msg.get("reason", "sentinel stop action")))
            elif msg.get("kind") == "arm":
                self.boundary.run("capture_message", self.capture.arm, msg)
            elif msg.get("kind") == "capture":
                self.boundary.run("capture_message", self.capture.take, msg)
            elif msg.get("kind") == "alert":
                alert = {k: v for k, v in msg.items() if k != "kind"}
                for cb in self.on_alert:
                    self.boundary.run("on_alert", cb, alert)
