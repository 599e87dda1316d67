"""Wrappers that are no ``torch.optim.Optimizer`` and step one inside: their step begins
the watched step.

apex's ``LARC`` (SwAV, VISSL and the self-supervised recipes that copy them) and
torchlars' ``LARS`` keep an optimizer as ``.optim`` and, in their own ``step()``, scale
every parameter's gradient by its trust ratio in place before calling the inner
optimizer's ``step()``. Read at the inner step, as the step hooks read them, the gradients
were the wrapper's: a contrastive model under LARC reported a gradient norm of 0.0139 at
every step (the trust coefficient times the weights' norm) while its loss's gradients fell
from 2.7 to 0.06, and no spike or vanishing gradient could ever show.

So the step of such a wrapper begins the watched step, as an optimizer's own step does:
:func:`follow` wraps its class's ``step`` to hand the step's start to the registry
(:func:`sentinel.instrument.registry.begins`) before the wrapper's body, and the inner
optimizer's own pre-hook then leaves it. The class is wrapped, never the object, so
nothing of Sentinel's is pickled with it. A wrapper is known when handed to
``sentinel.watch``; in zero-code mode it is found at the inner optimizer's first step,
from the frame that called it (:func:`caller_of`): the gradients of that one step are
already the wrapper's, so that step reports none. A ``step`` called with arguments (a
closure) is left as it is: its inner optimizer reads the gradients inside its own step.
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

_followed: weakref.WeakSet[type] = weakref.WeakSet()  # the classes whose step begins the watched step
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
    """The wrapper whose ``step()`` called ``opt.step()`` directly (the first frame of the
    stack outside torch and Sentinel), when it is no ``Optimizer``, keeps ``opt`` in one of
    :data:`INNER` and shows ``opt``'s ``param_groups`` as its own; None otherwise (a
    trainer class with a ``step()`` of its own and an ``.optimizer``). Never raises."""
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
        owner = frame.f_locals.get(code.co_varnames[0])
        if owner is None or isinstance(owner, torch.optim.Optimizer) or inner_of(owner) is not opt:
            return None
        # an optimizer's stand-in shows the inner one's groups as its own; a trainer class whose
        # step() runs the forward, backward() and opt.step() does not, and must not begin its steps
        return owner if getattr(owner, "param_groups", None) is opt.param_groups else None
    except Exception:
        return None


def follow(wrapper: Any, begins: Callable[[torch.optim.Optimizer], None]) -> bool:
    """Make each argument-free ``step()`` of ``wrapper``'s class call ``begins(inner)``
    first (once per class). False when its ``step`` is no plain function or its class
    cannot be changed (left as it is). Never raises."""
    try:
        return _follow(type(wrapper), begins)
    except Exception:
        return False


def _follow(cls: type, begins: Callable[[torch.optim.Optimizer], None]) -> bool:
    if cls in _followed:
        return True
    owner = next((k for k in cls.__mro__ if "step" in k.__dict__), None)
    if owner is not None and owner in _followed:  # a subclass of a class followed already
        _followed.add(cls)
        return True
    original = None if owner is None else owner.__dict__["step"]
    if owner is None or not inspect.isfunction(original) or owner.__module__ == "builtins":
        return False

    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            inner = inner_of(self)
            if inner is not None:
                begins(inner)  # raises only what a step's hooks raise: the stop action's TrainingHalted
        return original(self, *args, **kwargs)

    try:
        owner.step = step  # type: ignore[attr-defined]
    except Exception:  # a class that takes no new attribute: left as it is
        return False
    _followed.update((cls, owner))
    log.debug("sentinel: %s.step begins the watched step of its inner optimizer", owner.__qualname__)
    return True
