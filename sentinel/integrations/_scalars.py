"""What the adapters hand to ``Monitor.log`` beside the loss: a bounded set of scalars."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sentinel.instrument.options import launcher_run_name as launcher_run
from sentinel.instrument.scalars import to_value

__all__ = ["MAX_SCALARS", "launcher_run", "scalars"]

MAX_SCALARS = 16
"""At most this many extra scalars per step, in the framework's order."""


def scalars(items: Iterable[tuple[str, Any]], limit: int = MAX_SCALARS,
            skip: frozenset[str] = frozenset({"loss"})) -> dict[str, Any]:
    """Numbers and single-element tensors, at most ``limit``, named as the framework names them.

    Tensors are passed as they are (``Monitor.log`` reads device tensors back without a
    host sync); anything else (strings, lists, multi-element tensors) is left out.
    """
    out: dict[str, Any] = {}
    for name, value in items:
        if len(out) >= limit:
            break
        if name in skip or not isinstance(name, str):
            continue
        v = to_value(value)  # a number, or a device tensor left on its device
        if v is not None:
            out[name] = v
    return out
