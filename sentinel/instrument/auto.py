"""Zero-code instrumentation, switched on by ``SENTINEL_AUTO=1`` (``sentinel run`` sets it).

:func:`install` is idempotent and cheap: it registers torch's *global* optimizer step hooks,
wraps ``Tensor.backward`` to remember the last scalar loss, and wraps gradient clipping
(:mod:`sentinel.instrument.clip`) to keep the pre-clip total norm. Nothing connects until an
optimizer actually steps, so launchers and DataLoader workers never do. At an optimizer's
first step a :class:`~sentinel.instrument.monitor.Monitor` is attached to it, with the
module that owns its parameters (found once) naming the groups.
"""

from __future__ import annotations

import atexit
import gc
import sys
import logging
import os
import warnings
import weakref
from typing import Any

import torch

log = logging.getLogger("sentinel")

_installed = False
_monitors: weakref.WeakKeyDictionary[torch.optim.Optimizer, Any] = weakref.WeakKeyDictionary()
_last_loss: torch.Tensor | None = None
_scaler: Any = None  # the GradScaler that scaled the last loss, if any
_last_clip: tuple[torch.Tensor, float] | None = None  # clipped before any monitor attached
_failures = 0


def enabled() -> bool:
    return os.environ.get("SENTINEL_AUTO") == "1"


def install() -> bool:
    """Register the global hooks once, when ``SENTINEL_AUTO=1``. Returns True if installed now."""
    global _installed
    if _installed or not enabled():
        return False
    _installed = True
    atexit.register(close_all)
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_on_pre_step)
    register_optimizer_step_post_hook(_on_post_step)
    _wrap_backward()
    _wrap_grad_scaler()
    from sentinel.instrument import clip

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
    from sentinel.instrument.monitor import Monitor
    from sentinel.instrument.options import from_kwargs

    mon = Monitor(_find_model(opt), [opt], from_kwargs({}), scaler=_scaler)
    _monitors[opt] = mon
    if _last_clip is not None:  # clipped just before this first step: it belongs to it
        mon.note_clip(*_last_clip)
    return mon


def _on_pre_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    global _failures
    if opt in _monitors or _failures >= 3:
        return
    try:
        _attach(opt)  # its own pre hook is registered now and runs right after this one
    except Exception:
        _failures += 1
        if _failures == 1:
            log.warning("sentinel: could not attach to %s; training continues", type(opt).__name__,
                        exc_info=True)


def _on_post_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    # runs after the monitor's own post hook closed the step's report: the loss rides on it
    global _last_clip
    _last_clip = None
    mon = _monitors.get(opt)
    if mon is None or _last_loss is None:
        return
    if mon.scaler is None and _scaler is not None:
        mon.scaler = _scaler
    mon.log(loss=_unscaled(_last_loss))


def _unscaled(loss: torch.Tensor) -> torch.Tensor:
    scale = getattr(_scaler, "_scale", None)
    if isinstance(scale, torch.Tensor) and getattr(loss, "_sentinel_scaled", False):
        return loss / scale.to(loss.device)  # on the device: no sync
    return loss


def _wrap_backward() -> None:
    original = torch.Tensor.backward

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        global _last_loss
        try:
            if self.numel() == 1 and self.requires_grad:
                _last_loss = self.detach()
                if getattr(self, "_sentinel_scaled", False):
                    _last_loss._sentinel_scaled = True  # type: ignore[attr-defined]
        except Exception:
            pass
        return original(self, *args, **kwargs)

    backward.__doc__ = original.__doc__
    torch.Tensor.backward = backward  # type: ignore[method-assign]


def _wrap_grad_scaler() -> None:
    scaler_cls = torch.amp.GradScaler
    original = scaler_cls.scale

    def scale(self: Any, outputs: Any) -> Any:
        global _scaler
        out = original(self, outputs)
        try:
            if isinstance(out, torch.Tensor) and out.numel() == 1:
                _scaler = self
                out._sentinel_scaled = True  # type: ignore[attr-defined]
        except Exception:
            pass
        return out

    scaler_cls.scale = scale  # type: ignore[method-assign]


def close_all() -> None:
    """Close every auto-attached monitor (registered with atexit by the shim's initializer).

    After an uncaught exception the interpreter has set ``sys.last_value`` by the time
    atexit runs, so the goodbye frames say the script raised."""
    error = getattr(sys, "last_value", None)
    for mon in list(_monitors.values()):
        try:
            mon.close(error if isinstance(error, BaseException) else None)
        except Exception:
            pass
