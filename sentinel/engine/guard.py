"""The step guard's notes, engine side: counters, the series its rules judge, the rules' words.

A training process with the guard on sends a ``log`` frame at each step it skipped (and
at the first applied step after skips, and at the ``max_consecutive`` outcome) carrying a
:class:`~sentinel.wire.GuardNote`. From it:

- ``sentinel_guard_skipped_total{reason}``: skipped steps, by reason (``nonfinite``,
  ``spike``); both exist at 0 from the first note;
- ``sentinel_guard_consecutive_skips``: skips in a row at that step (0 when the step was
  applied); the ``StepSkipped`` (info) and ``StepsSkippedRepeatedly`` (warning) rules
  judge it;
- ``sentinel_guard_exhausted``: 1 where ``max_consecutive`` was reached (the run halted,
  or steps were let through), else 0; ``GuardExhausted`` (critical) judges it;
- the rules' context: ``note`` says the step, the reason, the norm against its bound and
  the batch; ``nonfinite_groups["guard"]`` the groups that held the non-finite values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sentinel.engine.ingested import Ingested
from sentinel.store import Labels, Store
from sentinel.wire import GUARD_REASONS, FrameError, GuardNote


def valid(v: Any, _limits: Any = None) -> bool:
    """Whether a frame's ``guard`` field is a guard note (engine/validate.py)."""
    try:
        GuardNote.from_wire(v)
    except FrameError:
        return False
    return True


def describe(note: GuardNote, step: int) -> str:
    """The alert's detail: ``step 9 (spike): norm 812 > bound 7.1, batch 8``."""
    if note.outcome == "through" and not note.skipped:
        what = f"step {step} let through after {note.consecutive or 'max_consecutive'} skips in a row"
    else:
        what = f"step {step} skipped ({note.reason})"
    if note.reason == "nonfinite" or not math.isfinite(note.norm):
        what += f": gradient norm {note.norm:.4g}"
    else:
        what += f": gradient norm {note.norm:.4g} > bound {note.bound:.4g}"
    if note.groups:
        what += "; non-finite in " + ", ".join(note.groups[:8])
    what += f"; batch {note.batch}" if note.batch is not None else "; batch index not exposed"
    if note.outcome == "halt":
        what += "; training halted (max_consecutive)"
    return what


def ingest_guard(store: Store, f: dict[str, Any], add: Callable[..., None], base: Labels,
                 ctx: Ingested) -> GuardNote:
    """Record a frame's guard note (checked by :func:`valid` already)."""
    note = GuardNote.from_wire(f["guard"])
    for reason in GUARD_REASONS:
        labels = tuple(sorted(base + (("reason", reason),)))
        store.inc("sentinel_guard_skipped_total", labels, 1.0 if note.skipped and note.reason == reason else 0.0)
    add("sentinel_guard_consecutive_skips", float(note.consecutive if note.skipped else 0))
    add("sentinel_guard_exhausted", 1.0 if note.outcome else 0.0)
    ctx.note = describe(note, int(f["step"]))
    if note.groups:
        ctx.nonfinite_groups["guard"] = list(note.groups)
    ctx.guard = note
    return note
