"""Which row of ``runs`` a frame belongs to: a run name used again is a new run.

A job's run name is a label the user picks, so it is used again: a script re-run with the
same ``run=``, ``sentinel run`` started twice, a notebook cell watched twice. Each of those
is a new row, numbered by ``attempt`` (1, 2, …) under its job and name. A frame (a step or
a log) of job J and run R goes to the latest row of (J, R) unless that run is over for the
frame's rank (:func:`starts_new`):

- the run finished (every rank said goodbye), or its command's exit status is recorded
  (``sentinel run``);
- this rank said goodbye in it (cleanly or on an exception);
- this rank starts over: a step frame for step 1 from a rank that already reported a step.

A rank that had not reported yet when the others said goodbye (a short run, a slow rank:
rank 1's first frame after rank 0's bye) joins their run instead, as long as it is one of
the ``world`` ranks the run's frames named and the run has no exit status
(:func:`late_rank`); the run is ``running`` again until that rank says goodbye too. So does
a stream new to the run of a rank that reported (a Hogwild worker, a process of its own,
whose first frame came after the other workers' goodbyes).

``sentinel run`` also starts a new row when it starts a command, unless the latest row of
that name has seen no frame and no end yet. A rank that crashed while the others go on
(one rank's exception, or ``TrainingCrashed``) does not end the run for the others.

A row loaded from the file (an engine started again, or after a failed batch) that is not
``running`` counts every rank as gone: whatever reports next is a new run.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from sentinel.wire import starts_over

Stream = int | tuple[int, str]
"""A rank, or ``(rank, opt)`` for an optimizer stream of a process with several."""


@dataclass(eq=False)
class RunRow:
    """The writer's view of one row of ``runs`` (the aggregates it keeps exact)."""

    id: int
    attempt: int
    stride: int
    samples: int
    records: int
    best: float | None
    state: str = "running"
    exit_status: int | None = None
    ranks: set[int] = field(default_factory=set)
    streams: set[Stream] = field(default_factory=set)
    """What reports in this row: each rank, or each optimizer stream of a rank (``(rank, opt)``)
    in a process with several."""
    byes: set[Stream] = field(default_factory=set)
    last: dict[Stream, int] = field(default_factory=dict)
    """The last step each rank (stream) reported in this row."""
    optimizers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Each stream's optimizer record (the ``optim`` of its frames), by stream label."""
    groups: list[str] | None = None
    world: int | None = None
    """The world size the run's frames named (None: not said)."""
    first_loss: float | None = None
    sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])  # grad sum, n, delta sum, n
    peak: float | None = None
    crashed_with: int = 0
    """The highest exit status the run's crash goodbyes gave (the row's ``exit_status``
    until the command's own end is recorded)."""
    ended: float | None = None
    """When it ended, as the file says, for a row read from the file (:attr:`loaded`)."""
    loaded: bool = False
    """Read from the file, written by another writer (or before a restart): its ranks are a
    guess from their count (0 to n-1), its ``ended`` the file's."""
    thread_failed: bool = False
    """A goodbye said the training thread ended on an exception while its process went on:
    the row stays ``crashed`` whatever the process exits with."""
    agg: dict[str, Any] = field(default_factory=dict)
    """Run columns to write at the batch's end."""

    @property
    def fresh(self) -> bool:
        """No frame and no end recorded yet."""
        return not self.ranks and self.exit_status is None and self.state == "running"


def stream_of(f: dict[str, Any]) -> Stream:
    """The rank, or ``(rank, opt)``, a frame reports for."""
    opt = f.get("opt")
    return (f["rank"], opt) if opt else f["rank"]


def starts_new(r: RunRow, kind: str, rank: Stream, step: int, t: float | None = None) -> bool:
    """Whether a frame of ``kind`` from ``rank`` (a rank or an optimizer stream) at ``step``
    (sent at ``t``) begins a new run rather than continuing ``r`` (see the module's docstring)."""
    if kind == "bye" or sent_before_end(r, kind, t):
        return False
    if r.state == "finished" and late_rank(r, rank):
        return False
    if r.state == "finished" or r.exit_status is not None or rank in r.byes:
        return True
    return kind == "step" and starts_over(step, r.last.get(rank))


def sent_before_end(r: RunRow, kind: str, t: float | None) -> bool:
    """Whether a frame sent at ``t`` belongs to ``r``, a finished row read from the file,
    because it was sent before another writer of the file ended it: each rank's own engine
    under a plain torchrun writes the one file, and rank 1's writer could finish the row
    before rank 0's first commit, whose steps then opened a second row (the file keeps how
    many ranks a row had, not which: rank 0 read as one that had said goodbye)."""
    return (kind != "bye" and r.loaded and r.state == "finished" and r.exit_status is None and t is not None
            and r.ended is not None and t < r.ended)


def late_rank(r: RunRow, stream: Stream) -> bool:
    """Whether ``stream`` is a rank of ``r`` that had not reported when the others said
    goodbye: one of the run's ``world`` ranks, new to it, or a stream new to it of one of
    its ranks (a Hogwild worker that started late); and no exit status recorded."""
    rank = stream[0] if isinstance(stream, tuple) else stream
    if r.exit_status is not None:
        return False
    if isinstance(stream, tuple) and rank in r.ranks:
        return stream not in r.streams
    return r.world is not None and 0 <= rank < r.world and rank not in r.ranks


_COLS = ("id, attempt, stride, samples, min_loss, ranks, groups, first_loss, grad_norm_sum, grad_norm_n, "
         "delta_sum, delta_n, peak_memory, state, exit_status, steps, world, ended")


def load_latest(db: sqlite3.Connection, job: str, run: str) -> RunRow | None:
    """The latest row of (job, run) in the file, or None."""
    row = db.execute(f"SELECT {_COLS} FROM runs WHERE job = ? AND run = ? ORDER BY attempt DESC LIMIT 1",
                     (job, run)).fetchone()
    if row is None:
        return None
    records = db.execute("SELECT COUNT(*) FROM loss_records WHERE run_id = ?", (row[0],)).fetchone()[0]
    ranks = set(range(row[5] or 0))
    state, steps = row[13], row[15]
    # a crashed row's status is the highest its goodbyes gave so far: a later, lower one
    # (another rank's, told to a writer that started since) must not overwrite it
    crashed_with = row[14] if state == "crashed" and row[14] else 0
    return RunRow(row[0], row[1], row[2], row[3], records, row[4], state=state, exit_status=row[14],
                  ranks=ranks, streams=set(ranks), byes=set(ranks) if state != "running" else set(),
                  last={0: steps} if steps else {}, groups=json.loads(row[6]) if row[6] else None,
                  world=row[16], first_loss=row[7], sums=[float(x) for x in row[8:12]], peak=row[12],
                  crashed_with=crashed_with, ended=row[17] if state != "running" else None, loaded=True)


def insert(db: sqlite3.Connection, job: str, run: str, host: str, t: float, attempt: int) -> RunRow:
    """A new row for (job, run) numbered ``attempt``."""
    cur = db.execute("INSERT INTO runs (job, run, host, started, last_seen, attempt) VALUES (?, ?, ?, ?, ?, ?)",
                     (job, run, host, t, t, attempt))
    assert cur.lastrowid is not None
    return RunRow(cur.lastrowid, attempt, 1, 0, 0, None)
