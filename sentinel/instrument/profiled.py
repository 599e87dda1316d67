"""Sentinel's work on the training's threads, named in the script's own profiles.

A script profiled with ``torch.profiler`` (PyTorch's profiler recipe, a trainer's profiler
callback built on it) records every operator its threads run,
Sentinel's among them. Unlabelled, the gradient reads of the step hooks came out as
operators the script never called (``aten::_foreach_norm``, ``aten::index_add_``,
``aten::stack``, ...) and their time as the optimizer's: in a three-layer MLP under AdamW,
``Optimizer.step#AdamW.step`` took 2.5 times its plain run's self CPU time, and the user
looking for the step's cost found it in AdamW.

While a profiler records, each hook's work runs inside a ``record_function`` range named
for it (:data:`STEP`, :data:`BACKWARD`, ...): its operators sit under that range in a
trace, and ``key_averages()`` gives its time a row of its own, off the self time of the
range it runs in. torch calls the optimizer's step hooks inside its own
``Optimizer.step#...`` range, so that range's *total* still includes them. Without a
profiler the cost is one check, ``torch.autograd._profiler_enabled()`` (0.04 µs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.autograd import _profiler_enabled

F = TypeVar("F", bound=Callable[..., Any])

STEP = "sentinel: optimizer step"
"""The step hooks: the gradients and updates read, the step's report."""
BACKWARD = "sentinel: backward"
"""The loss taken at ``backward()``, and what runs when it returns."""
CLIP = "sentinel: clip_grad_norm_"
"""The clipping's norm and bound noted."""
CAPTURE = "sentinel: input capture"
"""A forward's inputs held for an armed capture."""
LOG = "sentinel: log"
"""``Monitor.log()``, called by the script."""


def labelled(name: str) -> Callable[[F], F]:
    """``fn``, its work inside a profiler range ``name`` while a profiler records."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if not _profiler_enabled():
                return fn(*args, **kwargs)
            with torch.autograd.profiler.record_function(name):
                return fn(*args, **kwargs)
        return run  # type: ignore[return-value]
    return wrap
