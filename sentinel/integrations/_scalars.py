"""What the adapters hand to ``Monitor.log`` beside the loss: a bounded set of scalars."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

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
        if isinstance(value, torch.Tensor):
            if value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool:
                out[name] = value.detach().reshape(())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def launcher_run() -> str:
    """The run id a launcher set for every rank (as :func:`sentinel.watch` reads it), or ''."""
    for var in ("SENTINEL_RUN", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        value = os.environ.get(var)
        if value and value != "none":
            return value
    return ""
