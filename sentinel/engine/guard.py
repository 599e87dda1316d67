"""The step guard's notes, engine side: counters, the series its rules judge, the rules' words.

A training process with the guard on sends a ``log`` frame at each step it skipped (and
at its first judged step, at the first applied step after skips, and at the
``max_consecutive`` outcome), before that step's report, carrying a
:class:`~sentinel.wire.GuardNote`. From it:

- ``sentinel_guard_skipped_total{reason}``: skipped steps, by reason (``nonfinite``,
  ``spike``); both exist at 0 from the first note;
- ``sentinel_guard_consecutive_skips``: skips in a row at that step (0 when the step was
  applied); the ``StepSkipped`` (info) and ``StepsSkippedRepeatedly`` (warning) rules
  judge it;
- ``sentinel_guard_exhausted``: 1 where ``max_consecutive`` was reached (the run halted,
  or steps were let through), else 0; ``GuardExhausted`` (critical) judges it;
- for a cluster Prometheus, which sees only what a scrape finds (a run of skips may end
  between two scrapes): ``sentinel_guard_skip_run_length``, the skips in a row of the
  latest run of skips, kept after it ends, and ``sentinel_guard_exhausted_total``, the
  steps judged at ``max_consecutive``; the exported ``StepsSkippedRepeatedly`` and
  ``GuardExhausted`` judge them (:mod:`sentinel.rules.promexport`). The instrument's first
  note (at the first judged step) makes every guard series start at 0;
- ``guard_skipped`` in the rules' context of any frame of a skipped step
  (:func:`kept_out`): ``TrainingNonFinite`` does not fire for the gradients and the loss
  of a step that never reached the weights (``StepSkipped`` says it instead);
- the rules' context: ``note`` says the step, the reason, the norm against its bound and
  the batch; ``nonfinite_groups["guard"]`` the groups that held the non-finite values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sentinel.rules.ingested import Ingested
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


def kept_out(store: Store, base: Labels, step: int) -> bool:
    """Whether the guard kept step ``step`` of this rank out of the weights: the rank's guard
    note at that step (on this frame, or on one before it: the instrument sends a step's
    note before its report) says it was skipped."""
    last = store.last("sentinel_guard_consecutive_skips", base)
    return last is not None and last[0] == step and last[2] > 0


def ingest_guard(store: Store, f: dict[str, Any], add: Callable[..., None], base: Labels,
                 ctx: Ingested) -> GuardNote:
    """Record a frame's guard note (checked by :func:`valid` already)."""
    note = GuardNote.from_wire(f["guard"])
    for reason in GUARD_REASONS:
        labels = tuple(sorted(base + (("reason", reason),)))
        store.inc("sentinel_guard_skipped_total", labels, 1.0 if note.skipped and note.reason == reason else 0.0)
    add("sentinel_guard_consecutive_skips", float(note.consecutive if note.skipped else 0))
    if note.skipped or store.last("sentinel_guard_skip_run_length", base) is None:
        add("sentinel_guard_skip_run_length", float(note.consecutive if note.skipped else 0))
    add("sentinel_guard_exhausted", 1.0 if note.outcome else 0.0)
    store.inc("sentinel_guard_exhausted_total", base, 1.0 if note.outcome else 0.0)
    ctx.note = describe(note, int(f["step"]))
    if note.groups:
        ctx.nonfinite_groups["guard"] = list(note.groups)
    ctx.guard = note
    return note
