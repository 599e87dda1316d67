"""How long a rank is busy before each step's gradient sync, and whether its gradients
are all-reduced (DDP): what the engine compares across ranks (``RankStraggler``,
``RankDivergence``).

A rank's busy time per step runs from the end of the previous optimizer step to the
model's forward (data loading), plus the forward itself (the wrapped module's, so DDP's
buffer broadcast, a wait for the other ranks, is left out), plus anything between several
forwards (gradient accumulation). Ranks in lockstep have equal step times, so this is what
tells a straggler. Three ``perf_counter`` reads per forward (about 2.5 µs); nothing here
can raise.

An evaluation's forward (the model in ``eval()`` mode, or gradients off: ``no_grad``,
``inference_mode``, ``generate``) is also the rank's sign of life while it takes no step:
:class:`Heartbeat` turns those into at most one frame per ``heartbeat_seconds``, so that
an evaluation longer than the stall limit is not paged as a hung job. A training forward
is not one: a loop that computes losses but never steps (every batch skipped on a NaN)
makes no progress, and its stall must still page.

The hooks are plain functions, not wrapped like the optimizer hooks (``no_grad`` and
``torch.compiler.disable`` cost 10 µs a forward, and a disabled function is still an error
inside ``torch.compile(..., fullgraph=True)``). While torch.compile traces the model they
return at once, so a compiled forward holds none of them and is never broken up; a
compiled model then reports no busy time and the engine compares step times instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from sentinel.instrument import hidden
from sentinel.instrument.gcscan import live


def ddp_parts(model: torch.nn.Module | None, world: int) -> tuple[Any, Any, bool]:
    """``(outer, inner, ddp)`` for a watched model: the module whose forward starts a
    step's compute, the one whose forward is pure compute (no collective inside), and
    whether the gradients are all-reduced across ranks (DistributedDataParallel).

    The model may be the DDP wrapper or the module it wraps (then found with one gc
    scan, once, and only in a multi-rank run). ``nn.DataParallel`` (still in many
    single-node scripts) is a wrapper too, of one process: its module's names are the
    model's, as DDP's are, not ``module.``-prefixed."""
    if model is None:
        return None, None, False
    from torch.nn.parallel import DistributedDataParallel as DDP

    if isinstance(model, DDP):
        return model, model.module, True
    if isinstance(model, torch.nn.DataParallel):
        return model, model.module, False
    if world > 1:
        for obj in live(DDP):
            if obj.module is model:
                return obj, model, True
    return model, model, False


class Heartbeat:
    """Says, at most once per ``every`` seconds, that the rank works while it takes no
    optimizer step: the model's evaluation forwards, the ``DataLoader`` batches drawn with
    gradients off (``instrument/loaders.py``) and ``Monitor.heartbeat()`` beat it; each
    step winds it up again, so a training loop never sends a beat, and nothing beats
    before the first step.

    Args:
        every: seconds from the last step (or beat) before a beat is sent.
        send: called with the beats since the last step (an evaluation forward, a batch or
            a call each); the caller's boundary keeps it from raising.
    """

    def __init__(self, every: float, send: Callable[[int], None]) -> None:
        self.every, self.send = float(every), send
        self.due = float("inf")  # no beat before the first step: no stall can fire then
        self.beats = 0
        self._thread = threading.get_ident()  # a DataParallel replica's thread never sends

    def stepped(self) -> None:
        """An optimizer step ended: the next beat is due ``every`` seconds from now."""
        self.beats = 0
        self.due = time.perf_counter() + self.every

    def __call__(self, now: float) -> None:
        """One beat at ``now`` (``time.perf_counter()``)."""
        self.beats += 1
        if now >= self.due and threading.get_ident() == self._thread:
            self.due = now + self.every
            self.send(self.beats)


class BusyClock:
    """Accumulates a rank's busy time between two optimizer steps.

    Args:
        outer, inner: see :func:`ddp_parts` (the same module when not DDP).
    """

    def __init__(self, outer: torch.nn.Module, inner: torch.nn.Module) -> None:
        self.owner: Any = None  # what the model's hooks keep alive with the clock (its monitor)
        self._busy = 0.0
        self._seen = False
        self._mark: float | None = None  # since when time counts as busy
        self._fwd_t0 = 0.0
        self.heartbeat: Heartbeat | None = None  # beaten by each forward
        self.handles = [hidden.register(outer, "pre", self._outer_pre),
                        hidden.register(inner, "pre", self._inner_pre),
                        hidden.register(inner, "post", self._inner_post)]

    def step_done(self) -> float | None:
        """Call at the end of each optimizer step: the busy time of the step that just
        ended (None if no forward ran), and the start of the next one's."""
        busy = self._busy if self._seen else None
        self._busy, self._seen, self._mark = 0.0, False, time.perf_counter()
        return busy

    def _outer_pre(self, module: Any, args: Any) -> None:
        if torch.compiler.is_compiling():
            return
        if self._mark is not None:
            self._busy += time.perf_counter() - self._mark
            self._mark = None

    def _inner_pre(self, module: Any, args: Any) -> None:
        if torch.compiler.is_compiling():
            return
        self._fwd_t0 = time.perf_counter()

    def _inner_post(self, module: Any, args: Any, out: Any) -> None:
        if torch.compiler.is_compiling():
            return
        self._mark = time.perf_counter()
        self._busy += self._mark - self._fwd_t0
        self._seen = True
        if self.heartbeat is not None and not (module.training and torch.is_grad_enabled()):
            self.heartbeat(self._mark)  # an evaluation's forward (a training forward is no sign of progress)
