"""An evaluation loop's batches as heartbeats.

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
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sentinel.instrument import registry

log = logging.getLogger("sentinel")
_installed = False


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
        if not torch.is_grad_enabled():
            _beat()
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
