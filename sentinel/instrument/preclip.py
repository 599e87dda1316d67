"""Capture the total gradient norm that ``torch.nn.utils.clip_grad_norm_`` computes.

The optimizer-step hooks see the gradients after any clipping, so a clipped run would only
ever show norms at or below ``max_norm``. This module wraps torch's clipping while some
listener (a :class:`~sentinel.instrument.monitor.Monitor`, or the zero-code initializer)
is attached, and hands each listener the total-norm *tensor* and ``max_norm``: nothing is
read back here, the monitor reads the tensor with its report.

What is wrapped: ``torch.nn.utils.clip_grad._clip_grads_with_norm_`` where it exists
(torch >= 2.6). Both ``clip_grad_norm_`` and ``clip_grads_with_norm_`` look it up in
their module at call time, so a script that did ``from torch.nn.utils import
clip_grad_norm_`` before sentinel attached is still seen. On older torch the public
``clip_grad_norm_`` (in ``torch.nn.utils`` and ``torch.nn.utils.clip_grad``) is wrapped
instead, which misses names bound before attaching.

Listeners are called after the clipping has happened and never raise into training.
The original function is restored when the last listener detaches, unless something else
wrapped it on top of ours meanwhile (then ours stays, inert, to keep theirs working).
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from sentinel.instrument import profiled
from sentinel.instrument.untraced import eager_only

log = logging.getLogger("sentinel")

Listener = Callable[[torch.Tensor, float, "Sequence[torch.Tensor] | None"], None]
"""Called with the total norm, ``max_norm`` and the parameters clipped (None: not known,
a generator torch consumed)."""

# the listeners, a monitor's bound method weakly (a monitor must not outlive its model for this)
_listeners: list[Callable[[], Listener | None]] = []
# (module, attribute) -> (the function we wrapped, our wrapper)
_wrapped: dict[tuple[Any, str], tuple[Any, Any]] = {}
_failures = 0


class ClipHandle:
    """Detaches one listener; idempotent (the shape of torch's ``RemovableHandle``)."""

    def __init__(self, entry: Callable[[], Listener | None]) -> None:
        self._entry: Callable[[], Listener | None] | None = entry

    def remove(self) -> None:
        entry, self._entry = self._entry, None
        if entry is None:
            return
        try:
            _listeners.remove(entry)
        except ValueError:
            pass
        if not _listeners:
            _unwrap()


def attach(fn: Listener) -> ClipHandle:
    """Call ``fn(total_norm, max_norm)`` after every gradient clipping by norm.

    Returns:
        A handle whose ``remove()`` detaches ``fn``.
    """
    _listeners[:] = [e for e in _listeners if e() is not None]  # those of monitors gone with their models
    if not _listeners:
        _wrap()
    entry: Callable[[], Listener | None] = weakref.WeakMethod(fn) if inspect.ismethod(fn) else (lambda: fn)
    _listeners.append(entry)
    return ClipHandle(entry)


@eager_only
@profiled.labelled(profiled.CLIP)
def _notify(total_norm: Any, max_norm: Any, parameters: Any = None) -> None:
    global _failures
    if not _listeners or _failures >= 3:
        return
    try:
        if not isinstance(total_norm, torch.Tensor):
            return
        placements = getattr(total_norm, "placements", None)
        if placements is not None:  # a DTensor (FSDP2): torch's clip already all-reduced it
            if not all(pl.is_replicate() for pl in placements):
                return  # a partial norm is not the total; reading it would take a collective
            total_norm = total_norm.to_local()  # type: ignore[attr-defined]
        m = float(max_norm)  # a Python number (clip_grad_norm_ already did float(max_norm))
        params = [parameters] if isinstance(parameters, torch.Tensor) else (
            parameters if isinstance(parameters, (list, tuple)) else None)  # (clip_grad_norm_ passes a list)
        for entry in list(_listeners):
            fn = entry()
            if fn is not None:
                fn(total_norm, m, params)
    except Exception:  # never into training
        _failures += 1
        if _failures == 1:
            log.warning("sentinel: reading the clipped gradient norm failed; training continues",
                        exc_info=True)


def _targets() -> list[tuple[Any, str]]:
    from torch.nn.utils import clip_grad

    if callable(getattr(clip_grad, "_clip_grads_with_norm_", None)):
        return [(clip_grad, "_clip_grads_with_norm_")]
    return [(clip_grad, "clip_grad_norm_"), (torch.nn.utils, "clip_grad_norm_")]  # pragma: no cover


def _make_wrapper(original: Any, returns_norm: bool) -> Any:
    if returns_norm:  # pragma: no cover - torch < 2.6: the public clip_grad_norm_
        @functools.wraps(original)
        def public(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
            out = original(parameters, max_norm, *args, **kwargs)
            _notify(out, max_norm, parameters)
            return out
        return public

    @functools.wraps(original)
    def internal(parameters: Any, max_norm: float, total_norm: torch.Tensor,
                 foreach: bool | None = None) -> None:
        original(parameters, max_norm, total_norm, foreach)
        _notify(total_norm, max_norm, parameters)
    return internal


def _wrap() -> None:
    for module, attr in _targets():
        if (module, attr) in _wrapped:
            continue  # ours is still in the chain (another wrapper was put on top of it)
        original = getattr(module, attr)
        ours = _make_wrapper(original, attr == "clip_grad_norm_")
        setattr(module, attr, ours)
        _wrapped[(module, attr)] = (original, ours)


def _unwrap() -> None:
    for (module, attr), (original, ours) in list(_wrapped.items()):
        if getattr(module, attr, None) is ours:  # identity: functools.wraps copies attributes
            setattr(module, attr, original)
            del _wrapped[(module, attr)]
