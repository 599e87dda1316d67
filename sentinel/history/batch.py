"""What one batch of the history writer does to the file: frames, assembled sharded
steps, alert transitions, and ``sentinel run``'s start and end, each applied to its run's
row (:mod:`sentinel.history.attempts` picks the row) inside the writer's transaction.

The writer (:class:`sentinel.history.recorder.Recorder`) owns the thread, the queue and
the retries; this module owns the SQL, the in-memory view of the runs being written, and
what of a frame the queue holds (:func:`queued`: what the writer reads of it).
"""

from __future__ import annotations

import json
import math
import sqlite3
from typing import Any

from sentinel.history import attempts, skips
from sentinel.history.attempts import RunRow, sent_before_end, starts_new, stream_of
from sentinel.history.values import COLUMNS, group_blob, local_only, optimizer_of, sample, tags_of, transition_row
from sentinel.rules.alert import Transition
from sentinel.wire import starts_over

_UPSERT = (f"INSERT INTO samples (run_id, step, t, {', '.join(COLUMNS)}, groups) "
           f"VALUES (?, ?, ?, {', '.join('?' * len(COLUMNS))}, ?) ON CONFLICT (run_id, step) DO UPDATE SET "
           + ", ".join(f"{c} = COALESCE(excluded.{c}, {c})" for c in ("t", *COLUMNS, "groups")))
_UPSERT_STREAM = (f"INSERT INTO stream_samples (run_id, stream, step, t, {', '.join(COLUMNS)}, groups) "
                  f"VALUES (?, ?, ?, ?, {', '.join('?' * len(COLUMNS))}, ?) ON CONFLICT (run_id, stream, step) "
                  "DO UPDATE SET " + ", ".join(f"{c} = COALESCE(excluded.{c}, {c})" for c in ("t", *COLUMNS, "groups")))

_NOTES = frozenset(("guard", "tags", "optim", "cmd", "env"))
"""The fields that only some frames carry (:meth:`BatchWriter._notes`)."""
READ = ("t", "rank", "step", "kind", "opt", "job", "run", "world", "exc", "status", "thread", *sorted(_NOTES))
"""What the writer reads of a frame of a rank other than 0 (rank 0's frame is its row: all of it)."""


def queued(frame: dict[str, Any]) -> dict[str, Any]:
    """What the recorder queues of a frame: rank 0's whole, any other rank's :data:`READ` fields.

    A frame of a rank other than 0 only updates its run's row, so its per-group lists are let go
    on the engine's thread with the rest of the frame, at once: the queue holds a few fields,
    and the writer does not free, long after, the bulk of every frame that writes no row.
    """
    if frame.get("rank") == 0:
        return frame
    return {k: frame[k] for k in READ if k in frame}


class BatchWriter:
    """Applies batches of queued items to the history file.

    Args:
        max_points: sample rows kept per run at most (see :mod:`sentinel.history.recorder`).
        host: this machine's name, recorded with each new run.
    """

    def __init__(self, max_points: int, host: str) -> None:
        self.max_points, self.host = max_points, host
        self._runs: dict[tuple[str, str], RunRow] = {}
        # per run name, the row a start-over ended and the row it began: the other ranks'
        # last frames of the ended training still go to the first (see _frame)
        self._over_rows: dict[tuple[str, str], tuple[RunRow, RunRow]] = {}

    def write(self, db: sqlite3.Connection, batch: list[tuple[str, Any]]) -> None:
        """Apply ``batch`` (``(kind, item)`` pairs) inside the caller's transaction.

        Raises:
            sqlite3.Error: a statement failed; the in-memory view is then dropped (it may be
                ahead of the file, which the caller rolls back) and reloaded when next needed.
        """
        try:
            touched: set[RunRow] = set()
            for kind, item in batch:
                if kind == "frame":
                    touched.add(self._frame(db, item))
                elif kind == "assembled":
                    touched.add(self._assembled(db, item))
                elif kind == "alert":
                    touched.add(self._alert(db, item))
                elif kind == "start":
                    touched.add(self._start(db, *item))
                elif kind == "end":
                    touched.add(self._end(db, *item))
                elif kind == "moved":
                    touched.update(self._moved(db, *item))
            for r in touched:
                if r.agg:
                    cols = ", ".join(f"{k} = ?" for k in r.agg)
                    db.execute(f"UPDATE runs SET {cols} WHERE id = ?", (*r.agg.values(), r.id))
                    r.agg = {}
        except BaseException:
            self.forget()
            raise

    def forget(self) -> None:
        """Drop the in-memory view of the runs (after a rolled-back batch); rows are reloaded."""
        self._runs.clear()
        self._over_rows.clear()

    def _run(self, db: sqlite3.Connection, job: str, run: str, t: float) -> RunRow:
        """The latest row of (job, run), created if there is none."""
        r = self._runs.get((job, run))
        if r is None:
            r = attempts.load_latest(db, job, run) or attempts.insert(db, job, run, self.host, t, 1)
            if len(self._runs) > 1000:
                self._runs.clear()
            self._runs[(job, run)] = r
        return r

    def _over(self, db: sqlite3.Connection, r: RunRow) -> None:
        """End a running row whose training began again in the same process (the next fold
        of a k-fold loop): ``finished`` at its last frame, as nothing reports to it again."""
        if r.agg:
            cols = ", ".join(f"{k} = ?" for k in r.agg)
            db.execute(f"UPDATE runs SET {cols} WHERE id = ?", (*r.agg.values(), r.id))
            r.agg = {}
        db.execute("UPDATE runs SET state = 'finished', ended = last_seen WHERE id = ?", (r.id,))
        r.state = "finished"

    def _new_run(self, db: sqlite3.Connection, job: str, run: str, t: float, prev: RunRow) -> RunRow:
        r = self._runs[(job, run)] = attempts.insert(db, job, run, self.host, t, prev.attempt + 1)
        return r

    def _frame(self, db: sqlite3.Connection, f: dict[str, Any]) -> RunRow:
        t = float(f["t"])
        rank, step, kind = f["rank"], f["step"], f["kind"]
        who, opt = stream_of(f), f.get("opt", "")  # a rank, or one optimizer stream of a rank
        r = self._run(db, f["job"], f["run"], t)
        over = self._over_rows.get((f["job"], f["run"]))
        if over is not None and over[1] is r and who in over[0].streams and who not in r.streams and not (
                kind == "step" and step == 1):
            r = over[0]  # the last frames of the training that ended, from a rank not begun again yet (DDP)
            r.agg["ended"] = t
        elif sent_before_end(r, kind, t):  # its rank was guessed one that had said goodbye: it is not
            r.byes.discard(who)
            r.streams.discard(who)  # the other writer's streams all said goodbye: only this one counts
            r.ranks = {-1 - i for i in range(len(r.ranks))}  # the file's ranks, not which: this one is new
            r.state = r.agg["state"] = "running"
            r.agg["ended"] = None
        elif starts_new(r, kind, who, step, t):
            prev = r
            r = self._new_run(db, f["job"], f["run"], t, prev)
            if prev.state == "running" and kind == "step" and (who in prev.byes or starts_over(
                    step, prev.last.get(who))):
                # its training began again (or a stream that said goodbye begins anew while the run's others go
                # on: a task's model beside a meta-model): the row before holds the one that ended
                self._over(db, prev)
                if len(self._over_rows) > 1000:
                    self._over_rows.clear()
                self._over_rows[(f["job"], f["run"])] = (prev, r)
        elif r.state == "finished" and kind != "bye":  # a rank that had not reported yet joins
            r.state = r.agg["state"] = "running"
            r.agg["ended"] = None
        agg = r.agg
        agg["last_seen"] = t
        r.streams.add(who)
        if rank not in r.ranks:
            r.ranks.add(rank)
            agg["ranks"] = len(r.ranks)
            if isinstance(f.get("world"), int):
                r.world = agg["world"] = f["world"]
        if kind == "bye":
            r.byes.add(who)
            agg["ended"] = t
            if isinstance(f.get("exc"), str):
                r.state = agg["state"] = "crashed"
                if isinstance(f.get("thread"), str):  # its training thread failed; the process's status is to come
                    r.thread_failed = True
                    return r
                # a launcher's word (`sentinel run` attached: the command's status; the run's is
                # its ranks' highest, as srun reports it); an uncaught exception's has none: 1
                status = f.get("status")
                code = status if type(status) is int and status > 0 else 1
                r.crashed_with = agg["exit_status"] = max(r.crashed_with, code)
            elif r.byes >= r.streams and r.state == "running":
                r.state = agg["state"] = "finished"
            return r
        if kind == "step":
            r.last[who] = step
        if not f.keys().isdisjoint(_NOTES):
            self._notes(db, r, f, opt)
        if rank == 0:
            self._sample(db, r, f, opt)
        return r

    def _sample(self, db: sqlite3.Connection, r: RunRow, f: dict[str, Any], opt: str) -> None:
        """Rank 0's values: the run's aggregates, and the step's row when the stride keeps it."""
        t, step, kind, agg = float(f["t"]), f["step"], f["kind"], r.agg
        if f.get("shard") == "sharded":  # rank 0's shards only: the model's norms come assembled
            f = local_only(f)
        vals = sample(f)
        if opt not in ("", "0"):  # a further optimizer stream: its own rows, no run aggregates
            if vals and not (step > 1 and step % r.stride):
                db.execute(_UPSERT_STREAM, (r.id, opt, step, t, *map(vals.get, COLUMNS), group_blob(f)))
            return
        if kind == "step":
            agg["steps"] = step
            groups = f.get("groups")
            if isinstance(groups, list) and groups != r.groups:
                r.groups = list(groups)
                agg["groups"] = json.dumps(r.groups)
        self._aggregate(db, r, step, vals)
        if not vals:
            return
        self._put(db, r, step, t, vals, f, count=kind == "step")

    def _notes(self, db: sqlite3.Connection, r: RunRow, f: dict[str, Any], opt: str) -> None:
        """What a frame tells of its run besides its values: a guard note, tags, the optimizer,
        the command, the environment."""
        agg = r.agg
        if isinstance(f.get("guard"), dict):  # the step guard's note (issue 21)
            skips.record(db, r.id, f)
        if "tags" in f:
            tags = tags_of(f["tags"])
            if tags is not None:
                agg["tags"] = json.dumps(tags)
        if "optim" in f:
            optim = optimizer_of(f["optim"])
            if optim is not None:  # every stream's, in stream order ("0", "1", ...)
                r.optimizers[opt] = _followed(r.optimizers.get(opt), optim)
                agg["optimizer"] = json.dumps([o for k in sorted(r.optimizers, key=lambda k: (len(k), k))
                                               for o in r.optimizers[k]][:8])
        if isinstance(f.get("cmd"), str):
            db.execute("UPDATE runs SET command = ? WHERE id = ? AND command IS NULL", (f["cmd"][:1000], r.id))
        if isinstance(f.get("env"), dict):
            agg["env"] = json.dumps(f["env"], default=str)[:20_000]

    def _assembled(self, db: sqlite3.Connection, a: dict[str, Any]) -> RunRow:
        """The whole model's norms of a sharded step, merged into rank 0's row of that step."""
        r = self._run(db, a["job"], a["run"], float(a["t"]))
        if starts_new(r, "step", 0, a["step"]) and a["step"] != r.last.get(0):
            # rank 0's frame of this step is not in yet (its own ingest completed the step),
            # and the row is over: this step opens the new run rank 0's frame will join
            r = self._new_run(db, a["job"], a["run"], float(a["t"]), r)
        frame = {**a, "kind": "step"}
        vals = sample(frame)
        self._aggregate(db, r, a["step"], vals)
        if vals:
            self._put(db, r, a["step"], float(a["t"]), vals, frame, count=False)
        return r

    def _put(self, db: sqlite3.Connection, r: RunRow, step: int, t: float, vals: dict[str, float | None],
             frame: dict[str, Any], count: bool) -> None:
        """Write (or complete) the step's row, with ``frame``'s group blob, when the stride keeps it."""
        if step > 1 and step % r.stride:
            return  # off the stride: only the aggregates count it
        db.execute(_UPSERT, (r.id, step, t, *map(vals.get, COLUMNS), group_blob(frame)))
        if count:
            r.samples += 1
            if r.samples > self.max_points:
                self._thin(db, r)
            r.agg["samples"], r.agg["stride"] = r.samples, r.stride

    def _aggregate(self, db: sqlite3.Connection, r: RunRow, step: int, vals: dict[str, float | None]) -> None:
        """The run's exact aggregates, kept in memory and written once per batch."""
        agg = r.agg
        loss = vals.get("loss")
        if loss is not None:
            agg["final_loss"] = loss
            if not math.isfinite(loss):
                agg["nonfinite"] = 1
            else:
                if r.first_loss is None:
                    r.first_loss = agg["first_loss"] = loss
                # every new minimum for the first max_points; then only those 0.1% below the
                # last (steps to a target stay within 0.1% of its loss), 4 × max_points at most
                if (r.best is None or loss < (r.best if r.records < self.max_points else r.best * 0.999)) \
                        and r.records < 4 * self.max_points:
                    r.best = agg["min_loss"] = loss
                    r.records += 1
                    db.execute("INSERT OR REPLACE INTO loss_records VALUES (?, ?, ?)", (r.id, step, loss))
        g = vals.get("grad_norm")
        if g is not None:
            if math.isfinite(g):
                r.sums[0] += g
                r.sums[1] += 1
                agg["grad_norm_sum"], agg["grad_norm_n"] = r.sums[0], int(r.sums[1])
            else:
                agg["nonfinite"] = 1
        d = vals.get("delta_norm")
        if d is not None and math.isfinite(d):
            r.sums[2] += d
            r.sums[3] += 1
            agg["delta_sum"], agg["delta_n"] = r.sums[2], int(r.sums[3])
        peak = vals.get("mem_peak")
        if peak is not None and (r.peak is None or peak > r.peak):
            r.peak = agg["peak_memory"] = peak

    def _thin(self, db: sqlite3.Connection, r: RunRow) -> None:
        """Double the run's stride and delete its rows off the new stride (the first kept)."""
        r.stride *= 2
        for table in ("samples", "stream_samples"):
            db.execute(f"DELETE FROM {table} WHERE run_id = ? AND step > 1 AND step % ? != 0", (r.id, r.stride))
        r.samples = db.execute("SELECT COUNT(*) FROM samples WHERE run_id = ?", (r.id,)).fetchone()[0]

    def _alert(self, db: sqlite3.Connection, t: Transition) -> RunRow:
        r = self._run(db, t.job, t.run, t.time)
        db.execute("INSERT INTO alerts (run_id, alertname, severity, state_from, state_to, step, time, value, "
                   f"threshold, summary, causes, checks, ranks, groups) VALUES ({', '.join('?' * 14)})",
                   (r.id, *transition_row(t)))
        if t.alertname == "TrainingCrashed" and t.state_to == "firing":
            r.state = r.agg["state"] = "crashed"
        return r

    def _start(self, db: sqlite3.Connection, job: str, run: str, command: str, tags: dict[str, str],
               t: float) -> RunRow:
        r = self._run(db, job, run, t)
        if not r.fresh:  # the name was used before: this command is a new run
            r = self._new_run(db, job, run, t, r)
        db.execute("UPDATE runs SET command = ?, started = MIN(COALESCE(started, ?), ?) WHERE id = ?",
                   (command[:1000], t, t, r.id))
        if tags:
            db.execute("UPDATE runs SET tags = COALESCE(tags, ?) WHERE id = ?", (json.dumps(tags_of(tags)), r.id))
        return r

    def _moved(self, db: sqlite3.Connection, job: str, run: str, to: list[str], t: float) -> list[RunRow]:
        """The command ``sentinel run`` started as ``run`` reported under the names in ``to``
        instead (its script's own ``watch(run=...)``): their rows take the command and the
        tags, and ``run``'s row, which nothing reported to, is removed."""
        r = self._run(db, job, run, t)
        rows = [self._run(db, job, name, t) for name in to]
        if not r.fresh:
            return rows
        for row in rows:
            db.execute("UPDATE runs SET command = COALESCE(NULLIF(command, ''), (SELECT command FROM runs WHERE id = ?)),"
                       " tags = COALESCE(tags, (SELECT tags FROM runs WHERE id = ?)) WHERE id = ?", (r.id, r.id, row.id))
        db.execute("DELETE FROM runs WHERE id = ?", (r.id,))
        self._runs.pop((job, run), None)
        return rows

    def _end(self, db: sqlite3.Connection, job: str, run: str, status: int, t: float) -> RunRow:
        r = self._run(db, job, run, t)
        r.exit_status = r.agg["exit_status"] = status
        r.agg["ended"] = t
        # a failed training thread stays a crash, the process exiting 0; a rank that crashed and
        # was started again (torchrun's restarts) in a job that then finished does not
        r.state = r.agg["state"] = "finished" if status == 0 and not r.thread_failed else "crashed"
        return r


def _followed(before: list[dict[str, Any]] | None, now: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stream's optimizer record after a frame's: the frame's record takes the place of the
    entries of its classes (its hyperparameters follow the schedule), and a class the stream
    had not trained with yet follows the earlier ones, so a PINN trained by Adam, then LBFGS
    on the same steps shows "Adam+LBFGS", not the last one alone. At most 8 entries."""
    if not before:
        return now
    fresh = list(now)
    out = []
    for o in before:
        same = next((i for i, n in enumerate(fresh) if n["class"] == o["class"]), None)
        out.append(fresh.pop(same) if same is not None else o)
    return (out + fresh)[:8]

