"""An evaluation loop's batches as heartbeats, and a training loop's short last batch.

The watched model's evaluation forwards beat its monitor (``instrument/timing.py``), but
many scripts evaluate a copy of it: the EMA model that timm's and the YOLO trainers
validate each epoch (``copy.deepcopy`` carries none of Sentinel's hooks, by design), or a
model generating through a wrapper. Their batches still come from a ``DataLoader`` drawn
with gradients off (``with torch.no_grad(): for batch in loader``), so a batch drawn while
gradients are off beats every live monitor. A training loop draws its batches with
gradients on and never beats, so a loop that stops stepping still pages.

The hook is the loader iterator's ``_next_index`` (the sampler's next index, in the main
process, once per batch, before the batch is fetched): an error of the script's dataset or
workers is raised after it returned, so its traceback holds no frame of Sentinel's. It
costs 0.5–2 µs a batch (a 2-core VM, interleaved medians over a loader of 1-element
batches, each of which takes 27 µs; a real batch takes milliseconds). A torch without that method gets no hook, and evaluations of copies no
heartbeat.

The same hook remembers the iterator a training loop draws from (gradients on), so that a
step can tell it took the loader's short last batch (:func:`short_batch`): with
``drop_last=False``, the default, an epoch of 1,025 samples in batches of 64 ends with a
batch of one, whose gradient is about eight times the others' norm (one sample's noise,
not averaged) and whose loss is one sample's. The engine's spike rules skip such a step
instead of paging a spike every epoch. The check costs about 1.2 µs a step, the remembering
nothing measurable a batch (25.9 against 26.0 µs a batch of one, interleaved medians).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import torch

from sentinel.instrument import registry

log = logging.getLogger("sentinel")
_installed = False
_training: weakref.ref[Any] | None = None  # the loader iterator a training loop last drew from


def install() -> None:
    """Wrap the loader iterator's ``_next_index`` once per process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        from torch.utils.data.dataloader import _BaseDataLoaderIter
    except Exception:
        return
    original = getattr(_BaseDataLoaderIter, "_next_index", None)
    if original is None or getattr(original, "_sentinel", False):
        return

    def _next_index(self: Any) -> Any:
        global _training
        if not torch.is_grad_enabled():
            _beat()
        elif _training is None or _training() is not self:
            _training = weakref.ref(self)
        return original(self)

    _next_index._sentinel = True  # type: ignore[attr-defined]
    _next_index.__wrapped__ = original  # type: ignore[attr-defined]
    _BaseDataLoaderIter._next_index = _next_index  # type: ignore[method-assign]


def _beat() -> None:
    try:
        for monitor in registry.live_streams():
            monitor.heartbeat()
    except Exception:  # a heartbeat is never worth an error in the script's loop
        log.debug("sentinel: a loader heartbeat failed", exc_info=True)


def short_batch() -> list[int] | None:
    """``[size, batch size]`` when the batch a training loop drew last is its loader's last
    and holds less than half a batch (``drop_last=False`` and a remainder); else None
    (another batch, a sampler without a length, a custom batch sampler)."""
    it = _training() if _training is not None else None
    if it is None:
        return None
    try:
        sampler = it._index_sampler
        full = sampler.batch_size
        if sampler.drop_last or not full or it._num_yielded != len(it):
            return None
        size = len(sampler.sampler) % full
    except Exception:  # not a BatchSampler over a sized sampler: nothing to say
        return None
    return [size, full] if 0 < 2 * size < full else None
