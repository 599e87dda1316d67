"""What runs inside training. Imports only the standard library, torch, msgpack, msgspec
and the ground floor's ``wire``, ``errors`` and ``listen``; it reaches the daemon side (a
monitor's own engine) only through the package root (``sentinel._start_engine``).

A :class:`~sentinel.instrument.monitor.Monitor` is composed of parts with their own small
interfaces: :mod:`~sentinel.instrument.hooks` (what is hooked: the optimizers' steps, the
model, ``clip_grad_norm_``, a step's closure), :mod:`~sentinel.instrument.measure` (what is
measured per step) and :mod:`~sentinel.instrument.reporter` (what is sent: reports, readback,
frames, the sender; and the engine's replies: alerts, stop, capture)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sentinel.instrument.monitor import Monitor, TrainingHalted
    from sentinel.instrument.watching import watch

__all__ = ["Monitor", "TrainingHalted", "watch"]


def __getattr__(name: str) -> Any:
    if name == "watch":
        from sentinel.instrument.watching import watch

        return watch
    if name in __all__:
        from sentinel.instrument import monitor

        return getattr(monitor, name)
    raise AttributeError(f"module 'sentinel.instrument' has no attribute {name!r}")
