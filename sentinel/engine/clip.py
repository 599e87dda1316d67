"""The pre-clip gradient norm: what ``clip_grad_norm_`` computed before it clipped.

``sentinel_grad_norm`` is read at the optimizer step, after any clipping, so a clipped run
shows norms at or below ``max_norm``; the total norm the clipping saw is the one that
shows a spike or an explosion. Frames carry it as ``clip_norm`` with ``clip_max``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sentinel.store import Labels, Store


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def ingest_clip(f: dict[str, Any], add: Callable[..., None], store: Store, base: Labels) -> None:
    """Record a step frame's pre-clip norm, if it has one.

    Writes ``sentinel_grad_norm_preclip`` and ``sentinel_grad_clip_max_norm``, and counts
    ``sentinel_grad_clipped_steps_total`` (steps whose norm exceeded ``max_norm``, which
    torch scaled down). Fields of the wrong type are ignored.
    """
    norm, cap = f.get("clip_norm"), f.get("clip_max")
    if not _num(norm):
        return
    value = float(norm)  # type: ignore[arg-type]  # _num checked it
    add("sentinel_grad_norm_preclip", value)
    if _num(cap):
        limit = float(cap)  # type: ignore[arg-type]
        add("sentinel_grad_clip_max_norm", limit)
        store.inc("sentinel_grad_clipped_steps_total", base, float(value > limit))
