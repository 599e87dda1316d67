"""Optimizer stand-ins that are no ``torch.optim.Optimizer`` and scale the gradients in
their own ``step()`` before stepping the one inside: the gradients are read as that step
begins.

apex's ``LARC`` (SwAV, VISSL and the self-supervised recipes that copy them) and
torchlars' ``LARS`` keep an optimizer as ``.optim``, show its ``param_groups`` as their
own and, in their ``step()``, multiply every parameter's gradient by its trust ratio in
place before calling the inner optimizer's ``step()``. Read at the inner step, as the step
hooks read them, the gradients were the stand-in's: a contrastive model under LARC
reported a gradient norm of 0.0139 at every step (the trust coefficient times the
weights' norm) while its loss's gradients fell from 2.7 to 0.06, and no spike or
vanishing gradient could ever show.

So :func:`follow` wraps the stand-in's class's ``step`` (the class, never the object, so
nothing of Sentinel's is pickled with it) to read the gradients as it begins
(:func:`sentinel.instrument.registry.reads_ahead`); the inner step's hooks take that read
when the parameters still hold the same gradient tensors, changed in place. Stand-ins that
*make* the gradients in their ``step()`` (mixed-precision ones that copy the model's
gradients to fp32 master weights, unscale them and assign them, as DeepSpeed's
``FP16_Optimizer`` does) hold other tensors, or none, when their step begins: the inner
step reads them as before, and the class is no longer followed (:func:`stop`).

The stand-in is found at its optimizer's first step, from the frame that called it
(:func:`caller_of`): that step's gradients are the stand-in's already, so it reports none.
A ``step`` called with arguments (a closure) is left as it is.

A differentially private optimizer is found the same way, and only remembered: Opacus's
``DPOptimizer`` clips each sample's gradient, adds noise and divides by the batch size in
its ``step()`` before calling the SGD inside. Those are the gradients the SGD applies, and
the ones read; its per-sample bound is the optimizer record's clip (:func:`sample_clip`),
so that an SGD clipped per sample is not told to clip.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("sentinel")

INNER = ("optimizer", "_optimizer", "optim")
"""The attributes a wrapper keeps its optimizer in (Lightning's and Accelerate's
``optimizer``, DeepSpeed's ``_optimizer``, LARC's and torchlars' ``optim``)."""

_followed: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()  # class -> its step reads ahead
# an optimizer -> the differentially private wrapper that steps it (per_sample_bound)
_clipper_of: weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.ref[Any]] = weakref.WeakKeyDictionary()
_SKIP = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(os.path.abspath(torch.__file__)))


def inner_of(wrapper: Any) -> torch.optim.Optimizer | None:
    """The optimizer a wrapper keeps in one of :data:`INNER` (None: none)."""
    for attr in INNER:
        try:
            cand = getattr(wrapper, attr, None)
        except Exception:
            cand = None
        if isinstance(cand, torch.optim.Optimizer):
            return cand
    return None


def caller_of(opt: torch.optim.Optimizer) -> Any:
    """The object whose ``step()`` called ``opt.step()`` directly: the first frame of the
    stack outside torch and Sentinel, when it is a ``step`` method (None otherwise). Never
    raises."""
    try:
        frame: Any = sys._getframe(1)
        for _ in range(32):
            if frame is None:
                return None
            path = os.path.abspath(frame.f_code.co_filename)
            if not any(path.startswith(p + os.sep) for p in _SKIP):
                break
            frame = frame.f_back
        else:
            return None
        code = frame.f_code
        if code.co_name != "step" or code.co_argcount < 1:
            return None
        return frame.f_locals.get(code.co_varnames[0])
    except Exception:
        return None


def is_stand_in(owner: Any, opt: torch.optim.Optimizer) -> bool:
    """Whether ``owner`` (:func:`caller_of`) is a stand-in of ``opt``: no ``Optimizer``,
    keeping ``opt`` in one of :data:`INNER` and showing ``opt``'s ``param_groups`` as its
    own. A trainer class with a ``step()`` of its own and an ``.optimizer`` is none: its
    step() runs the forward, ``backward()`` and ``opt.step()``, and must not begin its
    steps. Never raises."""
    try:
        return (owner is not None and not isinstance(owner, torch.optim.Optimizer) and inner_of(owner) is opt
                and getattr(owner, "param_groups", None) is opt.param_groups)
    except Exception:
        return False


def per_sample_bound(wrapper: Any) -> float | None:
    """The norm a differentially private optimizer clips each sample's gradient to, before
    it adds its noise and steps the optimizer inside: Opacus's ``DPOptimizer`` (and its
    per-layer, adaptive and distributed kin) keeps it as ``max_grad_norm`` beside its
    ``noise_multiplier`` (the per-layer one: the norm of its layers' bounds, which bounds a
    sample's whole gradient). None for any other object. The instance's own attributes
    only: no property runs."""
    attrs = getattr(wrapper, "__dict__", None)
    if not isinstance(attrs, dict) or "noise_multiplier" not in attrs:
        return None
    bound = attrs.get("max_grad_norm")
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0.0 < bound < float("inf"):
        return None
    return float(bound)


def note_clipper(opt: torch.optim.Optimizer, wrapper: Any) -> None:
    """Remember ``wrapper`` as the one that clips each sample's gradient before ``opt``
    steps (:func:`per_sample_bound`), when it is one. Never raises."""
    try:
        if wrapper is not None and wrapper is not opt and per_sample_bound(wrapper) is not None:
            _clipper_of[opt] = weakref.ref(wrapper)
    except Exception:
        pass


def _clipper(opt: torch.optim.Optimizer) -> Any:
    """The wrapper :func:`note_clipper` remembered for ``opt`` (None: none, or gone)."""
    ref = _clipper_of.get(opt)
    return ref() if ref is not None else None


def sample_clip(opt: torch.optim.Optimizer) -> float | None:
    """The per-sample clipping bound ``opt``'s steps are taken under now (see
    :func:`note_clipper`), or None."""
    wrapper = _clipper(opt)
    return per_sample_bound(wrapper) if wrapper is not None else None


def averages_passes(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt``'s step applies the mean of its ``backward()`` passes' gradients since
    the last step, not their sum: a differentially private wrapper with
    ``loss_reduction="mean"`` (Opacus's default) divides the summed per-sample gradients by
    the expected batch size times the passes it accumulated (``BatchMemoryManager``'s
    physical batches, or steps skipped by hand), so the step's loss is their losses' mean."""
    attrs = getattr(_clipper(opt), "__dict__", None)
    return isinstance(attrs, dict) and attrs.get("loss_reduction") == "mean"


def follow(wrapper: Any, ahead: Callable[[torch.optim.Optimizer, type], None]) -> bool:
    """Make each argument-free ``step()`` of ``wrapper``'s class call ``ahead(inner,
    class)`` first (once per class). False when its ``step`` is no plain function, its
    class cannot be changed or it was stopped. Never raises."""
    try:
        return _follow(type(wrapper), ahead)
    except Exception:
        return False


def stop(cls: type) -> None:
    """``cls``'s steps read nothing ahead any more: its gradients were not the ones its
    inner optimizer was given."""
    for k in cls.__mro__:
        if k in _followed:
            _followed[k] = False


def _follow(cls: type, ahead: Callable[[torch.optim.Optimizer, type], None]) -> bool:
    if cls in _followed:
        return _followed[cls]
    owner = next((k for k in cls.__mro__ if "step" in k.__dict__), None)
    if owner is not None and owner in _followed:  # a subclass of a class followed already
        _followed[cls] = _followed[owner]
        return _followed[cls]
    original = None if owner is None else owner.__dict__["step"]
    if owner is None or not inspect.isfunction(original) or owner.__module__ == "builtins":
        return False

    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs and _followed.get(owner):
            inner = inner_of(self)
            if inner is not None:
                ahead(inner, owner)  # never raises
        return original(self, *args, **kwargs)

    try:
        owner.step = step  # type: ignore[attr-defined]
    except Exception:  # a class that takes no new attribute: left as it is
        return False
    _followed[owner] = _followed[cls] = True
    log.debug("sentinel: %s.step reads the gradients before it changes them", owner.__qualname__)
    return True
