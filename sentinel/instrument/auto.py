"""Zero-code instrumentation, switched on by ``SENTINEL_AUTO=1`` (``sentinel run`` sets it).

:func:`install` is idempotent and cheap: it tells the registry
(:mod:`sentinel.instrument.registry`, whose one global optimizer step hook sees every
optimizer that steps) to attach a monitor to any optimizer no monitor watches, and wraps
gradient clipping (:mod:`sentinel.instrument.clip`) to keep the pre-clip total norm.
Nothing connects until an optimizer actually steps, so launchers and DataLoader workers
never do. At an optimizer's first step a :class:`~sentinel.instrument.monitor.Monitor`
is attached to it, with the module that owns its parameters (found once) naming the
groups, taking the step's loss from ``backward()`` (:mod:`sentinel.instrument.losses`).
An optimizer re-created over the same parameters is followed by the same monitor, and a
script's own ``sentinel.watch`` of an optimizer replaces the automatic monitor.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import warnings
from typing import Any

import torch

log = logging.getLogger("sentinel")

_installed = False
_monitors: list[Any] = []
_last_clip: tuple[torch.Tensor, float] | None = None  # clipped before any monitor attached
_early: Any = None  # the losses passed to backward() since any optimizer last stepped (LossSum)


def enabled() -> bool:
    return os.environ.get("SENTINEL_AUTO") == "1"


def install() -> bool:
    """Register the global hooks once, when ``SENTINEL_AUTO=1``. Returns True if installed now."""
    global _installed
    if _installed or not enabled():
        return False
    _installed = True
    atexit.register(close_all)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from sentinel.instrument import clip, losses, registry

    global _early
    _early = losses.LossSum()  # a first step's micro-batches run before its optimizer is seen
    registry.set_fallback(_attach)
    register_optimizer_step_post_hook(_on_post_step)
    clip.attach(_on_clip)
    return True


def _on_clip(total_norm: torch.Tensor, max_norm: float) -> None:
    # the first step clips before its optimizer has a monitor: keep it for _attach
    global _last_clip
    _last_clip = (total_norm, max_norm)


def _find_model(opt: torch.optim.Optimizer) -> torch.nn.Module | None:
    """The largest module holding the optimizer's first parameter (one gc scan, at attach)."""
    first = next((p for g in opt.param_groups for p in g["params"]), None)
    if first is None:
        return None
    best: torch.nn.Module | None = None
    best_n = -1
    with warnings.catch_warnings():  # isinstance() on some lazy modules warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.nn.Module):
                params = list(obj.parameters())
                if len(params) > best_n and any(p is first for p in params):
                    best, best_n = obj, len(params)
    return best


def _attach(opt: torch.optim.Optimizer) -> Any:
    from sentinel.instrument.losses import scaler
    from sentinel.instrument.monitor import Monitor
    from sentinel.instrument.options import from_kwargs

    from sentinel.instrument.losses import LossSum

    global _early
    early, _early = _early, LossSum()  # this step's losses so far are the new monitor's
    mon = Monitor(_find_model(opt), [opt], from_kwargs({"capture_loss": True}), scaler=scaler(), auto=True,
                  loss_sum=early)
    _monitors.append(mon)
    if _last_clip is not None:  # clipped just before this first step: it belongs to it
        mon.note_clip(*_last_clip)
    return mon


def _on_post_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    global _last_clip
    _last_clip = None
    if _early is not None:
        _early.take()  # losses before an optimizer's first step are its step's, not older ones


def close_all() -> None:
    """Close every auto-attached monitor (registered with atexit by the shim's initializer).

    After an uncaught exception the interpreter has set ``sys.last_value`` by the time
    atexit runs, so the goodbye frames say the script raised."""
    error = getattr(sys, "last_value", None)
    for mon in list(_monitors):
        try:
            mon.close(error if isinstance(error, BaseException) else None)
        except Exception:
            pass
