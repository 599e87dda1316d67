"""Scalars passed to ``Monitor.log``: checked, bounded, and averaged over a step.

A value is a real number (``int``, ``float``, a NumPy scalar) or a one-element tensor of
a real dtype; anything else (a string, None, a bool, a vector, a complex number) is
dropped and counted, never the frame. Names are strings of 1 to
:data:`MAX_NAME_LENGTH` characters of ``A-Za-z0-9_.:/@+-`` (the frame's
:data:`~sentinel.wire.ScalarName`: a name the engine would refuse is dropped and counted
here), at most :data:`MAX_NAMES` distinct ones per monitor;
``loss`` is the loss, every other name is exported as ``sentinel_scalar{name=...}``, so
a user's name can never overwrite one of Sentinel's own series.

Values logged between two optimizer steps are averaged into the step's report: with
gradient accumulation, logging each micro-batch's loss gives the step's mean loss. A
device tensor is summed on its device (no read-back here); the mean is taken when the
report is read back.
"""

from __future__ import annotations

import numbers
import re
from typing import Any

import torch

from sentinel.wire import SCALAR_NAME

MAX_NAMES = 32
MAX_NAME_LENGTH = 64
_NAME = re.compile(SCALAR_NAME)


def to_value(v: Any) -> float | torch.Tensor | None:
    """A host float, a 0-d float32 device tensor, or None when ``v`` is no real scalar."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1 or v.dtype == torch.bool or v.is_complex():
            return None
        v = v.detach()
        if v.device.type == "cpu":  # reading a CPU tensor is no sync
            return float(v.reshape(()))
        return v.reshape(()).to(torch.float32)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    return float(v)


class Scalars:
    """The values logged for one report: per name a host sum, a device sum and a count."""

    __slots__ = ("host", "dev", "count")

    def __init__(self) -> None:
        self.host: dict[str, float] = {}
        self.dev: dict[str, torch.Tensor] = {}
        self.count: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.count)

    def __contains__(self, name: str) -> bool:
        return name in self.count

    def add(self, name: str, value: float | torch.Tensor) -> None:
        if isinstance(value, torch.Tensor):
            prev = self.dev.get(name)
            self.dev[name] = value if prev is None else prev + value.to(prev.device)
        else:
            self.host[name] = self.host.get(name, 0.0) + value
        self.count[name] = self.count.get(name, 0) + 1

    def merge(self, other: Scalars) -> None:
        for name, n in other.count.items():
            self.host[name] = self.host.get(name, 0.0) + other.host.get(name, 0.0)
            if name in other.dev:
                prev = self.dev.get(name)
                t = other.dev[name]
                self.dev[name] = t if prev is None else prev + t.to(prev.device)
            self.count[name] = self.count.get(name, 0) + n

    def rename(self, old: str, new: str) -> None:
        """Record ``old``'s values as ``new``'s (when ``new`` holds none yet)."""
        if old in self.count and new not in self.count:
            self.count[new] = self.count.pop(old)
            if old in self.host:
                self.host[new] = self.host.pop(old)
            if old in self.dev:
                self.dev[new] = self.dev.pop(old)

    def segments(self) -> dict[torch.device, dict[str, torch.Tensor]]:
        """The device sums to read back, as readback segments ``s:<name>``."""
        out: dict[torch.device, dict[str, torch.Tensor]] = {}
        for name, t in self.dev.items():
            out.setdefault(t.device, {})[f"s:{name}"] = t.reshape(1)
        return out

    def meta(self) -> dict[str, list[float]]:
        """``{name: [host sum, count]}``; the frame's mean adds the read-back device sum."""
        return {name: [self.host.get(name, 0.0), float(n)] for name, n in self.count.items()}


def means(meta: dict[str, list[float]], values: dict[str, list[float]]) -> dict[str, float]:
    """The frame's ``scalars``: each name's (host sum + device sum) / count."""
    out = {}
    for name, (host, n) in meta.items():
        dev = values.get(f"s:{name}")
        out[name] = (host + (dev[0] if dev else 0.0)) / n
    return out


class NameBudget:
    """Admits at most :data:`MAX_NAMES` distinct, well-formed names; counts what it drops."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.dropped = 0

    def admit(self, name: Any) -> bool:
        if name in self.names:
            return True
        if (not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_LENGTH or not _NAME.match(name)
                or len(self.names) >= MAX_NAMES):
            self.dropped += 1
            return False
        self.names.add(name)
        return True
