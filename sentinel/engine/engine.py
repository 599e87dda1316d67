"""The engine: decode → store → rules → alerts. One code path for the embedded engine and
the daemon."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from sentinel import wire
from sentinel.engine import crossrank
from sentinel.engine.ingest import Ingestor
from sentinel.engine.validate import Admission, Dropped, Limits, Refused, check_frame, fits
from sentinel.rules.config import RulePack, load_pack
from sentinel.rules.evaluator import RuleEngine
from sentinel.rules.exited import THREAD_FAILED
from sentinel.rules.ingested import Ingested
from sentinel.rules.lifecycle import Transition
from sentinel.store import Row, Store, labels_of

log = logging.getLogger("sentinel")

EXIT_STATUS = "sentinel_exit_status"
"""Gauge: the exit status recorded for a rank that ended without finishing (see rules/exited.py)."""

Listener = Callable[[Transition], object]

SCAN_PER_CALL = 4096
"""Pids checked for liveness per :meth:`Engine.check_processes` (about 1 µs each)."""
CRASHES_PER_CALL = 32
"""Crashes recorded per call (about 0.3 ms each: the crash rules and the rank's retirement)."""


class Engine:
    """Accepts encoded frames, keeps the series, evaluates the rules, hands out transitions.

    A daemon outlives the runs it watches, so a run's series are dropped once it has
    ended (every rank said goodbye or crashed) and ``ended_ttl`` seconds have passed, time
    for a last scrape, or once it has sent nothing for ``idle_ttl`` seconds.

    Args:
        store: the series store (a fresh one by default).
        pack: the rule pack (the built-in defaults by default).
        clock: wall clock, for tests.
        history: transitions kept in memory for the API.
        ended_ttl, idle_ttl: see above.
        limits: the caps every frame is held to before it is written (the defaults by default).
    """

    def __init__(self, store: Store | None = None, pack: RulePack | None = None,
                 clock: Callable[[], float] = time.time, history: int = 500,
                 ended_ttl: float = 600.0, idle_ttl: float = 86_400.0, limits: Limits | None = None,
                 alive: Callable[[int], bool] | None = None, node: str = "",
                 running: Callable[[int], bool] | None = None) -> None:
        self.store = store or Store()
        self.limits = limits or Limits()
        self.admission = Admission(self.limits)
        self.refused: dict[str, int] = {}
        """Frames rejected whole, by reason (``size``, ``decode``, ``schema``, ``range``, a cap)."""
        self.fields_dropped: dict[tuple[str, str], int] = {}
        """Fields taken out of frames that were otherwise ingested, by (field, reason)."""
        self.clock = clock
        self.ingestor = Ingestor(self.store)
        self.rules = RuleEngine(pack if pack is not None else load_pack(), self.store, clock)
        self.listeners: list[Listener] = []
        self.frame_listeners: list[Callable[[dict[str, Any]], object]] = []
        """Given every frame admitted and ingested (decoded; e.g. the history recorder's queue)."""
        self.assembled_listeners: list[Callable[[dict[str, Any]], object]] = []
        """Given each step of a sharded run once every rank's frame is in: the whole model's
        sums (see :meth:`sentinel.engine.shards.ShardAssembler.route`), after the frame listeners."""
        self.transitions: deque[Transition] = deque(maxlen=history)
        self.frames_received = 0
        self.frames_malformed = 0
        self.frames_by_field = 0
        """Frames the strict decode did not take whole, checked field by field instead (a NaN
        sum, a bad or unknown-typed field, another schema version)."""
        self.listener_errors = 0
        self.finished: set[tuple[str, str, int]] = set()
        # the optimizer streams of each rank of a process with several (frames with ``opt``)
        # that have not said goodbye: the rank ends with the last of them
        self.streams: dict[tuple[str, str, int], set[str]] = {}
        # the streams (job, run, rank, opt) whose last frame was a clean goodbye: a step frame from one
        # begins a new training, whatever its step (a model made per task, watched late, counts on)
        self.byes: set[tuple[str, str, int, str]] = set()
        # the process of each reporting rank's stream (job, run, rank, opt; from the socket's
        # credentials), checked on tick: a rank whose process is gone without a goodbye frame
        # crashed. Per stream: a rank's streams may be processes of their own (Hogwild workers)
        self.pids: dict[tuple[str, str, int, str], int] = {}
        # looked up at each call: a run forgotten replaces the dict
        self.rules.process_of = lambda key: self.pids.get(key)
        # where each stream's training thread was, told while no step came (a frame's
        # ``where``); a step clears it. TrainingStalled says it
        self.wheres: dict[tuple[str, str, int, str], str] = {}
        self.rules.where_of = lambda key: self.wheres.get(key)
        self.exited_ranks: dict[tuple[str, str, int], int] = {}  # rank → its recorded exit status
        self.owned_pids: set[int] = set()  # whose exit status the caller reports (sentinel run's CMD)
        self._scan: deque[tuple[str, str, int, str]] = deque()  # streams still to check in this sweep
        self._gone: dict[tuple[str, str, int, str], int] = {}  # found dead, crash not recorded yet
        self.ended_ttl, self.idle_ttl = ended_ttl, idle_ttl
        self.alive = alive
        """Whether a process still exists (the daemon side's; None: processes are not checked)."""
        self.running = running or alive
        """Whether a process exists and has not exited (a zombie has: its stream is free)."""
        self.aliases: dict[tuple[str, str, int], str] = {}
        """The run of its own a process's frames go to, by (job, run it named, pid): see :meth:`_split`."""
        self.runs_split = 0
        """Processes given a run of their own (:meth:`_split`)."""
        self.dropped_listeners: list[Callable[[str, str, set[tuple[str, str, int]]], object]] = []
        """Told ``(job, run, ranks that exited)`` when a run's series are dropped (the daemon
        removes the reply sockets crashed ranks left behind)."""
        self.halted: set[tuple[str, str]] = set()  # runs the stop action stopped: their exit is no crash
        self.runs_seen: dict[tuple[str, str], float] = {}  # the time of each run's last frame
        self.runs_dropped = 0
        self.restarts = 0
        """Times a rank's training began again at step 1 and its series started over (:meth:`_start_over`)."""
        self._crash_rules = self.rules.rules_of_kind("exited")
        self._cross_rules = self.rules.rules_reading(crossrank.METRICS)
        self.node = node
        """The run of node-level (GPU) alerts: the machine's name (the daemon side's)."""
        self._lock = threading.RLock()

    def feed(self, data: bytes, pid: int | None = None) -> bool:
        """Ingest one encoded frame whole, or reject it whole (and count it). Returns False
        if it was rejected.

        The frame is decoded, checked against the schema and held to the engine's caps
        (:mod:`sentinel.engine.validate`) before anything of it is written.

        Args:
            pid: the sending process, when the transport knows it (the daemon's socket
                does); its disappearance without a goodbye frame is a crash.
        """
        with self._lock:
            self.frames_received += 1
            try:
                if len(data) > self.limits.max_frame_bytes:
                    raise Refused("size", f"frame of {len(data)} bytes (limits.max_frame_bytes)")
                frame, dropped = self._decode(data)
                if pid is not None and self.running is not None:
                    self._split(frame, pid)
                last = self._restarting(frame) if frame["kind"] == "step" else None
                if last is not None:  # a new training's names: not counted against the last one's
                    self.admission.forget_rank(frame["job"], frame["run"], frame["rank"])
                self.admission.admit(frame, dropped)
            except Refused as exc:
                self._reject(exc.reason, exc)
                return False
            except Exception as exc:  # a bug in the checks: still nothing written, and counted
                self._reject("error", exc)
                return False
            for field, reason, detail in dropped:
                self._drop_field(field, reason, detail)
            try:
                ctx = self._ingest(frame, last)
            except Exception as exc:  # a bug: the checks above let through what ingest cannot take
                self._reject("error", exc)
                return False
            if pid is not None and frame["kind"] != "bye":
                self.pids[(frame["job"], frame["run"], frame["rank"], frame.get("opt", ""))] = pid
            self._hand(self.frame_listeners, frame)
            for values in ctx.assembled:
                self._hand(self.assembled_listeners, values)
            return True

    def _split(self, frame: dict[str, Any], pid: int) -> None:
        """Send the frame of a process to a run of its own (``RUN-2``, ``RUN-3``, ...) when
        another process that is still running reports the same stream (job, run, rank and
        optimizer label): the trials of a sweep run side by side by a launcher that trains
        nothing (each its own ``python train.py --lr X`` under one ``sentinel run``, all rank
        0 of its run), or two scripts started with one ``run=``. Their frames interleaved
        in one stream: steps going back and forth, each new process read as a restart, and
        the loss rules fired critical on the mix. The first process to report keeps the name;
        a process that reports after the stream's last one ended (said goodbye, or exited)
        takes it over, as a run's next attempt."""
        job, run = frame["job"], frame["run"]
        aliases = self.aliases
        if aliases:
            own = aliases.get((job, run, pid))
            if own is not None:
                frame["run"] = own
                return
        if frame["kind"] == "bye":
            return
        other = self.pids.get((job, run, frame["rank"], frame.get("opt", "")))
        if other is None or other == pid or self.running is None or not self.running(other):
            return
        taken = {r for j, r, _, _ in self.pids if j == job} | {v for k, v in aliases.items() if k[0] == job}
        n = 1
        while True:
            n += 1
            own = f"{run[:self.limits.max_label_length - 1 - len(str(n))]}-{n}"
            if own not in taken:
                break
        if len(aliases) >= 4096:  # a bound: the oldest process's goes (it reports as its run's name again)
            del aliases[next(iter(aliases))]
        aliases[(job, run, pid)] = frame["run"] = own
        self.runs_split += 1
        log.warning("sentinel engine: pid %d reports rank %d of run %r, which pid %d reports too and is still "
                    "running (two trainings given one run name: a sweep's trials side by side?); pid %d's "
                    "frames go to run %r", pid, frame["rank"], run, other, pid, own)

    def _decode(self, data: bytes) -> tuple[dict[str, Any], Dropped]:
        """The frame as a map, and what of it was dropped: a frame that holds to
        :class:`wire.Frame` and :func:`fits` whole goes through at once (the fast path);
        any other is checked field by field (:func:`check_frame`).

        Raises:
            Refused: the frame's identity is unreadable.
        """
        try:
            strict: wire.Frame | None = wire.decode_strict(data)
        except Exception:  # msgspec.DecodeError (ValidationError too), RecursionError
            strict = None
        if strict is not None and fits(strict, self.limits):
            return wire.as_map(strict), Dropped()
        self.frames_by_field += 1
        try:
            frame = wire.decode(data)
        except wire.FrameError as exc:  # not msgpack at all, or off the schema
            raise Refused("decode" if str(exc).startswith("malformed") else "schema", str(exc)) from None
        return frame, check_frame(frame, self.limits)

    def _hand(self, listeners: list[Callable[[dict[str, Any]], object]], item: dict[str, Any]) -> None:
        for listener in listeners:
            try:
                listener(item)
            except Exception:
                self.listener_errors += 1
                if self.listener_errors == 1:
                    log.warning("sentinel engine: frame listener failed", exc_info=True)

    def _drop_field(self, field: str, reason: str, detail: str) -> None:
        key = (field, reason)
        n = self.fields_dropped[key] = self.fields_dropped.get(key, 0) + 1
        if n == 1:  # once per field and reason
            log.warning("sentinel engine: dropped a frame's field %r (%s: %s) and kept the rest; further "
                        "ones are only counted in sentinel_daemon_frame_fields_dropped_total", field, reason, detail)

    def _reject(self, reason: str, exc: Exception) -> None:
        self.frames_malformed += 1
        n = self.refused[reason] = self.refused.get(reason, 0) + 1
        if n == 1:  # once per reason: a flood of bad frames must not flood the log
            log.warning("sentinel engine: refused a frame (%s: %s); further ones are only counted "
                        "in sentinel_daemon_frames_refused_total{reason=%r}", reason, exc, reason,
                        exc_info=reason == "error")

    def ingest(self, frame: dict[str, Any]) -> Ingested:
        """Record a decoded frame and evaluate the rules; returns what ingesting it found."""
        return self._ingest(frame, self._restarting(frame) if frame["kind"] == "step" else None)

    def _ingest(self, frame: dict[str, Any], restarting: int | None) -> Ingested:
        """:meth:`ingest`, told whether the frame begins its stream's training again
        (``restarting``: the stream's last step, from :meth:`_restarting`; :meth:`feed`
        asks once, before admission, and passes it on)."""
        job, run, rank, kind = frame["job"], frame["run"], frame["rank"], frame["kind"]
        store = self.store
        if restarting is not None:
            self._start_over(job, run, rank, restarting)
        with store.lock:  # the GPU poller's thread writes the store too
            store.written.clear()
        ctx = self.ingestor.ingest(frame)
        rk = (job, run, rank)
        opt: str = frame.get("opt", "")
        self.runs_seen[(job, run)] = float(frame["t"])
        if kind == "step":
            if self.wheres:
                self.wheres.pop((*rk, opt), None)
        elif "where" in frame:
            if len(self.wheres) > 10_000:
                self.wheres.clear()
            self.wheres[(job, run, rank, opt)] = frame["where"]
        if kind == "bye" and not frame.get("exc") and not frame.get("status"):
            if len(self.byes) > 10_000:
                self.byes.clear()
            self.byes.add((*rk, opt))
        elif self.byes and kind in ("step", "log"):
            self.byes.discard((*rk, opt))
        if kind == "bye" and opt and not frame.get("exc") and not frame.get("status") and self._stream_ends(rk, opt):
            self.pids.pop((*rk, opt), None)  # one optimizer of several stopped: the rank goes on with the others
        elif kind == "bye":
            pid = self.pids.get((*rk, opt))
            self._forget_pids(rk)
            if type(frame.get("status")) is int and frame["status"]:  # a launcher's word (run.py, attached)
                self.exited(job, run, frame["status"], rank, float(frame["t"]), who=str(frame.get("exc", "")))
            elif isinstance(frame.get("exc"), str) and isinstance(frame.get("thread"), str):
                # its training thread ended on an uncaught exception; the process goes on
                who = (f"thread {frame['thread'][:64]!r} of rank {rank}" + (f" (pid {pid})" if pid else "")
                       + f" raised {frame['exc'][:200]}")
                self.exited(job, run, THREAD_FAILED, rank, float(frame["t"]), who=who)
            elif isinstance(frame.get("exc"), str):  # it is leaving on an uncaught exception
                who = f"rank {rank}" + (f" (pid {pid})" if pid else "") + f" raised {frame['exc'][:200]}"
                self.exited(job, run, 1, rank, float(frame["t"]), who=who)
            else:
                self.finished.add(rk)
                self._publish(self.rules.retire(job, run, rank))
            self.streams.pop(rk, None)  # after the crash record, which reads its first stream's last values
        elif kind in ("step", "log"):
            if opt:
                self.streams.setdefault(rk, set()).add(opt)
            self.finished.discard(rk)
            if rk in self.exited_ranks:  # reporting again (a restart): its crash is over
                del self.exited_ranks[rk]
                self.store.add(EXIT_STATUS, self._labels(rk), frame["step"], float(frame["t"]), 0.0)
            with store.lock:  # the rules whose metrics got no sample have nothing new
                ctx.written = frozenset(store.written)
            self._publish(self.rules.evaluate(job, run, rank, frame["step"], float(frame["t"]), ctx, opt=opt))
            for other in ctx.crossrank:  # the last rank of a step completed the comparison
                if other != rank and self._cross_rules:
                    self._publish(self.rules.evaluate(job, run, other, frame["step"], float(frame["t"]),
                                                      only=self._cross_rules, opt=opt))
        return ctx

    def _restarting(self, frame: dict[str, Any]) -> int | None:
        """The last step of the frame's stream when this step frame begins its training again
        (:func:`wire.starts_over`, or the first after the stream said goodbye), else None."""
        job, run, rank, opt = frame["job"], frame["run"], frame["rank"], frame.get("opt", "")
        last = self.ingestor.last_step(job, run, rank, opt)
        if last is not None and (wire.starts_over(frame["step"], last) or (
                self.byes and (job, run, rank, opt) in self.byes)):
            return last
        return None

    def _start_over(self, job: str, run: str, rank: int, last: int) -> None:
        """A rank's training began again at step 1 (:func:`wire.starts_over`: the next fold of
        a k-fold loop, a notebook cell run again). Its series, rule state and alerts start
        over (its alerts resolve), so no rule reads the new training against the old one."""
        self.restarts += 1
        log.info("sentinel engine: rank %d of run %s/%s began again at step 1 (after step %d); its series and "
                 "alerts start over", rank, job, run, last)
        self._publish(self.rules.retire(job, run, rank))
        self.store.drop(job, run, rank)
        self.ingestor.forget_rank(job, run, rank)

    def _stream_ends(self, rk: tuple[str, str, int], opt: str) -> bool:
        """A goodbye of optimizer stream ``opt`` of a rank: True while other streams of the
        rank report on (a crash, its exception, still ends the whole rank)."""
        open_ = self.streams.get(rk)
        if open_ is None:
            return False
        open_.discard(opt)
        return bool(open_)

    def exited(self, job: str, run: str, status: int, rank: int | None = None,
               now: float | None = None, who: str = "") -> list[Transition]:
        """Record that a rank's process (or, with ``rank`` None, the whole command) ended
        with ``status`` before finishing, and judge the crash rules.

        Args:
            status: the exit code, ``128 + N`` for death by signal ``N``, or -1 when the
                process is gone and its status unknown. 0 records nothing.
            rank: the rank; None means the whole command (``sentinel run``'s CMD): every
                rank of the run that reported, goodbye or not, since the job failed
                anyway (rank 0 when none ever reported: it died before its first step). A
                rank that had said a clean goodbye is said to have ended its script first:
                the command failed at its processes' exit.
            who: what ended, for the message (e.g. ``"torchrun (pid 4242)"``).

        Returns:
            The transitions made (also delivered to the listeners).
        """
        with self._lock:
            now = self.clock() if now is None else now
            if status == 0 or (rank is None and (job, run) in self.halted):
                return []  # a clean exit, or the stop action's own doing
            if rank is not None:
                ranks = [rank]
            else:
                known = self.rules.ranks(job, run) | {k[2] for k in self.finished | set(self.exited_ranks)
                                                      if k[:2] == (job, run)}
                ranks = sorted(known) or [0]
            self.runs_seen[(job, run)] = max(self.runs_seen.get((job, run), now), now)
            out: list[Transition] = []
            for r in ranks:
                said = who
                if rank is None and (job, run, r) in self.finished:  # its goodbye came first: a failure at exit
                    said = (f"{who}, " if who else "") + (
                        "after the script had ended without an error (its goodbye came first): it failed as it "
                        "exited (a raise SystemExit(N), which Sentinel does not see, an atexit handler, or a native "
                        "abort in teardown such as torch's gloo exit race)")
                out += self._record_exit((job, run, r), status, now, said)
            out += self.rules.tick(now)  # fire now rather than after the group wait
            self._publish(out)
            return out

    def _record_exit(self, rk: tuple[str, str, int], status: int, now: float, who: str) -> list[Transition]:
        """One rank's exit: its status series and the crash rules (no group-wait tick)."""
        if self.exited_ranks.get(rk, 0) > 0:
            return []  # its real exit status is recorded already
        job, run, r = rk
        self.runs_seen[(job, run)] = max(self.runs_seen.get((job, run), now), now)
        self.exited_ranks[rk] = status
        self.finished.discard(rk)
        self._forget_pids(rk)
        labels = self._labels(rk)
        streams = sorted(self.streams.pop(rk, ()), key=lambda o: (len(o), o))
        # the last values of the rank's first optimizer stream, when it has several
        values = labels_of(job=job, run=run, rank=r, optimizer=streams[0]) if streams else labels
        last = self.store.last("sentinel_step", values)
        step = last[0] if last is not None else self.rules.last_step(job, run, r) or 0
        self.store.add(EXIT_STATUS, labels, step, now, float(status))
        note = "; ".join(p for p in (who, self._last_values(values, now)) if p)
        out = self.rules.evaluate(job, run, r, step, now, Ingested(note=note), only=self._crash_rules)
        # no stall alert for a dead rank; its crash alert stays until it reports again
        return out + self.rules.retire(job, run, r, now, keep=self._crash_rules)

    def check_processes(self, now: float | None = None) -> list[Transition]:
        """Look for reporting ranks whose process no longer exists, and record some of them
        as crashed.

        The work per call is bounded, so that a thousand processes vanishing at once do
        not stall the frames of the others: at most :data:`SCAN_PER_CALL` pids are checked
        (round robin over every reporting rank) and at most :data:`CRASHES_PER_CALL`
        crashes recorded; the rest wait in :attr:`crash_backlog` for the next calls
        (:meth:`reap`, which the service runs between its batches of frames).
        """
        with self._lock:
            alive = self.alive
            if alive is None:  # nothing to check processes with: only goodbyes end ranks
                return self.reap(now=now)
            if not self._scan:
                self._scan.extend(self.pids)
            pids, owned, gone = self.pids, self.owned_pids, self._gone
            for _ in range(min(SCAN_PER_CALL, len(self._scan))):
                rk = self._scan.popleft()
                pid = pids.get(rk)
                if pid is not None and pid not in owned and rk not in gone and not alive(pid):
                    gone[rk] = pid
            return self.reap(now=now)

    @property
    def crash_backlog(self) -> int:
        """Ranks found gone whose crash is not recorded yet."""
        return len(self._gone)

    def reap(self, limit: int | None = None, now: float | None = None) -> list[Transition]:
        """Record up to ``limit`` (:data:`CRASHES_PER_CALL`) of the crashes found by
        :meth:`check_processes`. Their alerts fire at the next :meth:`tick`."""
        with self._lock:
            now = self.clock() if now is None else now
            out: list[Transition] = []
            for _ in range(min(CRASHES_PER_CALL if limit is None else limit, len(self._gone))):
                key = next(iter(self._gone))
                pid = self._gone.pop(key)
                if self.pids.get(key) != pid:
                    continue  # it said goodbye, or reports again from a new process
                out += self._record_exit(key[:3], -1, now, f"rank {key[2]} (pid {pid}) stopped reporting")
            self._publish(out)
            return out

    def _forget_pids(self, rk: tuple[str, str, int]) -> None:
        """The rank ended: none of its streams' processes is watched any more."""
        for key in [k for k in self.pids if k[:3] == rk]:
            del self.pids[key]
        for key in [k for k in self.wheres if k[:3] == rk]:
            del self.wheres[key]

    def _labels(self, rk: tuple[str, str, int]) -> tuple[tuple[str, str], ...]:
        return labels_of(job=rk[0], run=rk[1], rank=rk[2])

    def _last_values(self, labels: tuple[tuple[str, str], ...], now: float) -> str:
        """The rank's last values, for a crash message."""
        parts = []
        for name, title, fmt in (("sentinel_loss", "loss", "{:.4g}"), ("sentinel_grad_norm", "grad norm", "{:.3g}"),
                                 ("sentinel_step_duration_seconds", "step time", "{:.3g} s")):
            last = self.store.last(name, labels)
            if last is not None:
                parts.append(f"{title} " + fmt.format(last[2]))
        used = self.store.last("sentinel_memory_used_bytes", labels)
        cap = self.store.last("sentinel_memory_capacity_bytes", labels)
        if used is not None:
            parts.append(f"memory {used[2] / 2**30:.3g} GiB" + (f" of {cap[2] / 2**30:.3g} GiB" if cap else ""))
        ts = self.store.last("sentinel_last_step_timestamp_seconds", labels)
        if ts is None:
            return "no step reported"
        return f"last values (step {ts[0]}, {max(0.0, now - ts[2]):.0f} s before): " + ", ".join(parts)

    def tick(self, now: float | None = None) -> list[Transition]:
        """Dead processes, time-based rules (stalls) and group waits; call about once a second."""
        with self._lock:
            self.check_processes(now)
            out = self.rules.tick(now) + self.rules.evaluate_gpus(self.node, now)
            out += self._drop_old_runs(self.clock() if now is None else now)
            self._publish(out)
            return out

    def _drop_old_runs(self, now: float) -> list[Transition]:
        out: list[Transition] = []
        for (job, run), seen in list(self.runs_seen.items()):
            ended = not self.rules.ranks(job, run)  # every rank said goodbye or crashed
            if now - seen < (self.ended_ttl if ended else self.idle_ttl):
                continue
            out += self.rules.retire(job, run, now=now)  # crash alerts included: the run is gone
            self.store.drop(job, run)
            self.ingestor.forget(job, run)
            self.admission.forget(job, run)
            exited = {rk for rk in self.exited_ranks if rk[:2] == (job, run)}
            for listener in self.dropped_listeners:  # e.g. a crashed rank's reply socket, left behind
                try:
                    listener(job, run, exited)
                except Exception:
                    self.listener_errors += 1
            del self.runs_seen[(job, run)]
            self.finished = {rk for rk in self.finished if rk[:2] != (job, run)}
            self.exited_ranks = {rk: v for rk, v in self.exited_ranks.items() if rk[:2] != (job, run)}
            self.pids = {rk: v for rk, v in self.pids.items() if rk[:2] != (job, run)}
            self.wheres = {rk: v for rk, v in self.wheres.items() if rk[:2] != (job, run)}
            self.aliases = {k: v for k, v in self.aliases.items() if (k[0], v) != (job, run)}
            self.streams = {rk: v for rk, v in self.streams.items() if rk[:2] != (job, run)}
            self.byes = {k for k in self.byes if k[:2] != (job, run)}
            self._gone = {rk: v for rk, v in self._gone.items() if rk[:2] != (job, run)}
            self.halted.discard((job, run))
            self.runs_dropped += 1
            log.info("sentinel engine: dropped the series of run %s/%s (%s)", job, run,
                     "ended" if ended else "silent")
        return out

    def _publish(self, transitions: list[Transition]) -> None:
        for t in transitions:
            self.transitions.append(t)
            log.debug("sentinel alert %s: %s", t.state_to, t.summary)  # the console listener says it
            for listener in self.listeners:
                try:
                    listener(t)
                except Exception:
                    self.listener_errors += 1
                    log.warning("sentinel engine: alert listener failed", exc_info=True)

    def alerts_json(self) -> list[dict[str, Any]]:
        """Active (pending, firing) then recently resolved alerts, as the HTTP API shows them."""
        return self.rules.active() + self.rules.recent()

    def api_alerts(self) -> dict[str, Any]:
        """The body of ``GET /api/v1/alerts``."""
        return {"status": "success", "data": {"alerts": self.alerts_json()}}

    def health_rows(self) -> Iterator[Row]:
        """The engine's own metrics and the firing alerts, for the exporter."""
        yield ("sentinel_daemon_up", "gauge", (), 1.0)
        yield ("sentinel_daemon_frames_received_total", "counter", (), float(self.frames_received))
        yield ("sentinel_daemon_frames_malformed_total", "counter", (), float(self.frames_malformed))
        for reason, n in self.refused.items():
            yield ("sentinel_daemon_frames_refused_total", "counter", (("reason", reason),), float(n))
        for (field, reason), n in self.fields_dropped.items():
            yield ("sentinel_daemon_frame_fields_dropped_total", "counter", (("field", field), ("reason", reason)),
                   float(n))
        yield ("sentinel_daemon_rule_evaluations_total", "counter", (), float(self.rules.evaluations))
        for labels, value in self.rules.firing_series():
            yield ("sentinel_alert_firing", "gauge", tuple(sorted(labels.items())), value)
