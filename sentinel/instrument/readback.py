"""Device-to-host readback: one non-blocking copy per device per report.

A report is a set of named segments (vectors). On each device the segments are
concatenated into one float32 vector and copied with ``non_blocking=True`` into pinned
host memory, and a CUDA event is recorded after the copy. :meth:`Readback.poll` hands
back the reports whose events have completed, never waiting on the device. On the CPU
the values are ready at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Segments = dict[str, "torch.Tensor"]


@dataclass
class _Pending:
    meta: Any  # the report (instrument/frames.py)
    layout: list[tuple[str, int]]
    parts: list[tuple[Any, Any]]  # (pinned host tensor, cuda event) or (values list, None)


class Readback:
    """Reports in flight from device to host, bounded.

    Args:
        max_pending: reports in flight at most; when exceeded the oldest is dropped and
            ``on_drop`` is called.
        on_drop: called once per dropped report.
    """

    def __init__(self, max_pending: int = 4, on_drop: Callable[[], None] | None = None) -> None:
        self.max_pending = max_pending
        self.on_drop = on_drop
        self._pending: deque[_Pending] = deque()
        self._pinned: dict[int, list[torch.Tensor]] = {}

    def submit(self, meta: Any, per_device: dict[torch.device, Segments]) -> None:
        """Start the copy of a report.

        Args:
            meta: host-side values that travel with the report unchanged.
            per_device: for each device, its segments; a segment missing on one device
                counts as zeros there. Values of the same segment are summed across devices.
        """
        lengths: dict[str, int] = {}
        for segs in per_device.values():
            for name, t in segs.items():
                lengths[name] = max(lengths.get(name, 0), t.numel())
        layout = sorted(lengths.items())
        parts: list[tuple[Any, Any]] = []
        for device, segs in per_device.items():
            if device.type != "cuda":
                # values on the host are ready now: no concatenation, no copy
                vals: list[float] = []
                for name, n in layout:
                    seg = segs.get(name)
                    vals.extend(seg.reshape(-1).tolist() if seg is not None else [0.0] * n)
                parts.append((vals, None))
                continue
            pieces = []
            for name, n in layout:
                piece = segs.get(name)
                if piece is None:
                    piece = torch.zeros(n, dtype=torch.float32, device=device)
                pieces.append(piece.reshape(-1).to(torch.float32))
            vec = torch.cat(pieces) if pieces else torch.zeros(0, device=device)
            host = self._take_pinned(vec.numel())
            host.copy_(vec, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            parts.append((host, event))
        self._pending.append(_Pending(meta, layout, parts))
        while len(self._pending) > self.max_pending:
            self._pending.popleft()  # its pinned buffers may still be in use: not recycled
            if self.on_drop is not None:
                self.on_drop()

    def poll(self, wait: bool = False) -> list[tuple[Any, dict[str, list[float]]]]:
        """Completed reports, oldest first, as ``(meta, {segment: values})``.

        Args:
            wait: block until every pending report is complete (only for ``close()``).
        """
        done = []
        while self._pending:
            p = self._pending[0]
            if not all(ev is None or ev.query() for _, ev in p.parts):
                if not wait:
                    break
                for _, ev in p.parts:
                    if ev is not None:
                        ev.synchronize()
            self._pending.popleft()
            total: list[float] | None = None
            for host, _ in p.parts:
                vals = host if isinstance(host, list) else host.tolist()
                total = vals if total is None else [a + b for a, b in zip(total, vals)]
            values: dict[str, list[float]] = {}
            off = 0
            for name, n in p.layout:
                values[name] = (total or [])[off: off + n]
                off += n
            self._release(p)
            done.append((p.meta, values))
        return done

    def __len__(self) -> int:
        return len(self._pending)

    def _take_pinned(self, n: int) -> torch.Tensor:
        free = self._pinned.get(n)
        if free:
            return free.pop()
        return torch.empty(n, dtype=torch.float32, pin_memory=True)

    def _release(self, p: _Pending) -> None:
        for host, ev in p.parts:
            if ev is not None and isinstance(host, torch.Tensor):
                self._pinned.setdefault(host.numel(), []).append(host)
