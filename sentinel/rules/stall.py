"""``stall``: no new step from a rank for ``max(min_seconds, factor × median step time)``.

Time-based: the rule engine evaluates it on ``tick(now)`` with ``ctx.now`` the current
time, and on every ingested frame of the rank (which is the "it moved again" that
resolves it). The window is any per-step series of the rank (``sentinel_step``); only its
sample times are read.

A rank that evaluates between steps (an evaluation longer than the limit) sends heartbeats;
the silence then counts from the later of the rank's last step and the run's last
heartbeat (``ctx.heartbeat``, any rank's: the ranks that wait in a collective while rank 0
evaluates alone are not stalled either), so an evaluation is not paged as a hang, and a
hang after it is.

An optimizer's stream whose process goes on stepping another optimizer (``ctx.sibling_step``)
is not stalled either: a script that trains in phases, one optimizer after another (the
PyTorch examples' Forward-Forward trains each layer by its own Adam in turn, every one kept
alive by its layer), leaves the done ones silent while the process works. A hang stops
every stream of the process, and pages each.

Where the training thread waits, the instrument says, once no step came for a heartbeat's
interval (``ctx.where``: its innermost Python frame and the script's, ``wait
(threading.py:355) from load_batch (train.py:40)``): the detail ends with it, so the page
answers the runbook's first question (``py-spy dump``) for the Python side.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

from pydantic import Field

from sentinel.rules.base import Context, Params, Verdict, median
from sentinel.store import Window


class StallParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        min_seconds: never fire before this much silence: checkpoint saves and data-loader
            restarts legitimately pause the steps for minutes (an evaluation sends
            heartbeats, which the silence counts from).
        factor: the silence must also exceed this many median inter-frame times.
        window: frames whose spacing gives the median.
    """

    min_seconds: float = Field(default=600.0, gt=0.0)
    factor: float = Field(default=20.0, gt=0.0)
    window: int = Field(default=50, ge=2)

    def samples(self) -> int:
        return self.window


def detect(window: Window, params: StallParams, ctx: Context) -> Verdict | None:
    """Fire when ``ctx.now`` is more than the limit past the latest sample's time and past
    the run's last heartbeat.

    Returns:
        None for an empty window. The verdict's value is the silence in seconds, its
        threshold the limit, its baseline the median frame spacing (when known).
    """
    if len(window) == 0:
        return None
    times = window.times.tolist()
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    typical = median(gaps) if gaps else None
    limit = params.min_seconds
    if typical is not None:
        limit = max(limit, params.factor * typical)
    since_step = max(0.0, ctx.now - times[-1])
    beat = since_step if ctx.heartbeat is None else min(since_step, max(0.0, ctx.now - ctx.heartbeat))
    sibling = since_step if ctx.sibling_step is None else min(since_step, max(0.0, ctx.now - ctx.sibling_step))
    silence = min(beat, sibling)
    if sibling < beat:
        detail = (f"no step for {since_step:.0f} s, another optimizer of its process stepped {sibling:.0f} s ago "
                  f"(limit {limit:.0f} s)")
    elif silence < since_step:
        detail = f"no step for {since_step:.0f} s, the run's last heartbeat {silence:.0f} s ago (limit {limit:.0f} s)"
    else:
        detail = f"no step for {silence:.0f} s (limit {limit:.0f} s)"
    if ctx.where:
        detail += f"; its training thread is in {ctx.where}"
    return Verdict(silence > limit, silence, limit, baseline=typical, detail=detail)


K = TypeVar("K", bound=tuple[Hashable, ...])


def siblings_stepped(last: Mapping[K, float], process_of: Callable[[K], int | None]) -> dict[K, float]:
    """Per stream, the time of the latest step of another stream of the same rank and
    process: ``last`` holds each stream's latest step time under a key whose last element
    names the stream (the optimizer) and whose others the rank; ``process_of`` gives a
    stream's pid where it is known (None: taken for the rank's one process). Streams of a
    rank with a single stream get none."""
    out: dict[K, float] = {}
    for key in last:
        pid = process_of(key)
        times = [t for k, t in last.items() if k[:-1] == key[:-1] and k != key
                 and (pid is None or process_of(k) in (None, pid))]
        if times:
            out[key] = max(times)
    return out
