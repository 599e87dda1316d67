"""Sentinel's global hooks kept out of ``torch.compile``'s tracing.

A script may compile a function that steps its optimizer (PyTorch's compiling-optimizer
recipe: ``@torch.compile(fullgraph=False) def step(): opt.step()``), or clips its
gradients inside one. The optimizer's step wrapper calls the global step hooks, so Dynamo
traces into whatever they call: without this, it traced Sentinel's attach, a monitor's set-up and
its socket's connect, printed a warning of its own to the script's stderr ("Dynamo does not
know how to trace the builtin ``posix._path_normpath``") and compiled Sentinel's functions.

:func:`eager_only` makes a hook that, while Dynamo traces, calls its body through
``torch.compiler.disable``: a graph break (the recipe's ``fullgraph=False`` allows them, and
the step wrapper's own ``_use_grad`` breaks the graph there already), the body run eagerly
at run time with the real values. Outside tracing it calls the body directly: one
``torch.compiler.is_compiling()`` (0.2 µs), and no ``torch._dynamo`` import (1.8 s) in a
script that never compiles. (A hook that returned at once while traced, as the forward
hooks of :mod:`sentinel.instrument.timing` do, would miss every compiled step.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


def eager_only(fn: F) -> F:
    """``fn``, never traced by ``torch.compile`` (see the module's docstring)."""
    twin: list[Callable[..., Any]] = []  # fn's disabled twin, made on first use

    def hook(*args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        if not twin:  # Dynamo cannot trace this call: a graph break, run eagerly
            twin.append(torch.compiler.disable(fn))
        return twin[0](*args, **kwargs)

    # a code object of its own: Dynamo keeps its compiled entries (at most 8) per code object,
    # so the hooks sharing one would each take a share of them (two: before and after the twin)
    hook.__code__ = hook.__code__.replace(co_name=fn.__name__)
    return functools.wraps(fn)(hook)  # type: ignore[return-value]
