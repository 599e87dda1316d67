"""The rule engine: runs the enabled rules of a pack against the store, per ingested frame.

The engine calls :meth:`RuleEngine.evaluate` after it has written one step frame of one
rank to the store, and :meth:`RuleEngine.tick` about once a second for the time-based
rules (stalls) and for alerts waiting for other ranks. Both return the transitions made,
which the caller stores and delivers.

Cost: a rule is evaluated for a series only when that series got a new sample at this
very step (so an update ratio sampled every 10 steps is judged every 10 steps), and every
``every_steps`` steps at most; ``threshold`` rules on the latest value skip the window
entirely. Each sample is judged once: a second frame for the same step judges only the
series that got a new sample with it (a log frame after the step frame, or the log frames
of iterations whose optimizer step the AMP scaler skipped, which repeat the step number).

``every_steps`` is phased per rule (steps where ``(step + offset) % every_steps == 0``) so
heavy rules don't all land on the same step. Off its phase a rule still runs to catch up
when ``every_steps`` steps, or ``2 × every_steps`` frames, have passed since it last
judged a sample of the rank: a series sampled more sparsely than every step (memory every
10 steps) may never have a sample on the rule's phase, and while the AMP scaler skips
every step the step number stands still and only frames arrive.

The series a rule reads for a rank are looked up once, and again when the store gains a
series (its ``generation``: a new series, or a block of group series rebuilt), and every
``refresh_steps`` steps as a safety net.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from sentinel.store import Labels, Store, labels_of
from sentinel.rules.base import Context, Verdict
from sentinel.rules.compiled import Compiled, RankState, compile_rule, select
from sentinel.rules.config import Rule, RulePack
from sentinel.rules.lifecycle import Lifecycle, Transition
from sentinel.rules.threshold import compare

AMP_SKIPS = "sentinel_amp_skipped_steps_total"
NODE_JOB = "node"
"""The job of alerts about the machine rather than a training run (GPU health)."""
_NO_LABELS: Mapping[str, str] = {}  # shared: detectors never modify their context
NO_RANK = -1
"""The rank of series that belong to no rank; never listed in an alert's ranks."""


class RuleEngine:
    """Evaluates a rule pack on a store and keeps the alerts' life cycle.

    Thread-safe: one lock serialises evaluation and the read-outs.

    Args:
        pack: the rules; disabled ones are skipped.
        store: where the engine writes the series.
        clock: wall-clock seconds, for alert timestamps and group waits.
        recent_limit: resolved alerts kept for :meth:`recent`.
        refresh_steps: how often (in steps) a rank's series list per rule is re-read.
    """

    def __init__(
        self,
        pack: RulePack,
        store: Store,
        clock: Callable[[], float] = time.time,
        *,
        recent_limit: int = 200,
        refresh_steps: int = 1000,
    ) -> None:
        self.pack = pack
        self.store = store
        self._clock = clock
        self._refresh = refresh_steps
        self._life = Lifecycle(recent_limit)
        self._lock = threading.RLock()
        compiled = [compile_rule(i, r) for i, r in enumerate(pack.enabled())]
        self._gpu_rules = [c for c in compiled if c.rule.per == "gpu"]
        self._step_rules = [c for c in compiled if not c.spec.time_based and c.rule.per != "gpu"]
        self._time_rules = [c for c in compiled if c.spec.time_based and c.rule.per != "gpu"]
        self._n_rules = len(compiled)
        self._runs: dict[tuple[str, str], set[int]] = {}
        self._ranks: dict[tuple[str, str, int, str], RankState] = {}  # (job, run, rank, stream)
        # the last sample judged, as its (step, time), per rule and series
        self._done: dict[tuple[int, Labels], tuple[int, float]] = {}
        # what a detector with a quiet() shortcut left at its last full evaluation, per series
        self._memos: dict[tuple[int, Labels], dict[str, Any]] = {}
        self.evaluations = 0  # verdicts taken (rule × series), for sentinel_daemon_rule_evaluations_total

    def evaluate(
        self,
        job: str,
        run: str,
        rank: int,
        step: int,
        t: float,
        ctx: Mapping[str, Any] | None = None,
        only: Collection[str] | None = None,
        opt: str = "",
    ) -> list[Transition]:
        """Evaluate the step-driven rules for one rank after its frame for ``step``.

        Args:
            t: the frame's wall-clock time.
            ctx: ``nonfinite_groups`` (``{source: [group, ...]}``, first ones first),
                ``written`` (the gauges this frame wrote: other rules are skipped) and
                ``lr_change_step`` (the last step at which the learning rate changed by
                more than the engine's factor, or None), ``lr_fraction`` (the lr over its
                peak, see ``Context.lr_fraction``), and optionally ``note``, a
                phrase for detectors that print one (``Context.note``).
            only: evaluate just these rules (e.g. the cross-rank ones, for a rank whose
                frame for ``step`` was judged already).
            opt: the frame's optimizer stream (``""``: the rank's only one).

        Returns:
            Transitions to firing or resolved, in order.
        """
        ctx = ctx or {}
        lr_change: int | None = ctx.get("lr_change_step")
        lr_fraction: float | None = ctx.get("lr_fraction")
        nonfinite: Mapping[str, Sequence[str]] = ctx.get("nonfinite_groups") or {}
        note: str = ctx.get("note") or ""
        guard_skipped = bool(ctx.get("guard_skipped"))  # the step guard kept this step out
        written: frozenset[str] | None = ctx.get("written")
        store, life = self.store, self._life
        with self._lock:
            now = self._clock()
            rs = self._rank(job, run, rank, opt)
            labels = rs.labels
            ranks = self._runs.setdefault((job, run), set())
            ranks.add(rank)
            if only is None:  # a frame of this rank (not a re-evaluation for other ranks' data)
                rs.last_step = step
                rs.frames += 1
                skips = store.counter(AMP_SKIPS, labels)
                amp_skipped = skips > rs.amp
                rs.amp = skips
            else:
                amp_skipped = False
            frame = rs.frames
            touched: list[str] = []
            sels, judged, refresh, done, gen = rs.sel, rs.judged, self._refresh, self._done, store.generation
            memos = self._memos
            for c in self._step_rules if only is None else [c for c in self._step_rules if c.name in only]:
                if step < c.gate_until or written is not None and c.metrics.isdisjoint(written):
                    continue  # warming up, or no new sample of its metrics in this frame
                if c.until and step > c.until and not life.is_open(c.name, job, run):
                    continue  # an early-phase check, over (an open alert is judged until it resolves)
                if c.every > 1 and (step + c.offset) % c.every:
                    # off its phase: run only to catch up (a sparse series, a frozen step)
                    seen = judged[c.idx]
                    if seen is not None and step - seen[0] < c.every and frame - seen[1] < 2 * c.every:
                        continue
                if c.grace and lr_change is not None and lr_change <= step < lr_change + c.grace:
                    continue
                if c.floor and lr_fraction is not None and lr_fraction < c.floor:
                    continue  # the schedule has taken the lr far below its peak: expected
                sel = sels[c.idx]
                # looked up again when the store has a new series (the rule's may be among
                # them) and every refresh_steps
                if sel is None or sel.generation != gen or not 0 <= step - sel.refreshed < refresh:
                    sel = select(c, self.store, job, run, rank, rs, step)
                if sel.metric is None:
                    continue  # nothing to judge for this rank (yet)
                name, params, metric = c.name, c.params, sel.metric
                # with no open alert only a firing verdict changes anything, so a value
                # that cannot fire (spec.idle) needs no window and no verdict
                held = life.open_series(name, job, run)
                idle = None if held is not None else c.spec.idle
                quiet = None if held is not None else c.spec.quiet
                since = max(c.rule.warmup_steps, (lr_change or 0) if c.rule.lr_resets_baseline else 0)
                lr_for = c.rule.lr_for_steps
                one = 1 if lr_for and lr_change is not None and lr_change <= step < lr_change + lr_for else None
                sampled = False
                for series_labels, extra, series in sel.series:
                    last = series.last()
                    if last is None or last[0] != step:
                        continue  # no new sample of this series at this step
                    sampled = True
                    if idle is not None and idle(last[2], params):
                        continue
                    memo = None
                    if c.spec.quiet is not None:
                        memo = memos.get((c.idx, series_labels))
                        if (quiet is not None and memo is not None and memo.get("since") == since
                                and quiet(last[2], params, memo, series.count - memo["count"])):
                            continue  # cannot fire: no window, no verdict
                    verdict: Verdict | None
                    if c.fast:  # check() inlined: most values are quiet and need no Verdict
                        self.evaluations += 1
                        v = last[2]
                        if v != v or (params.skip_zero and v == 0.0):
                            continue  # NaN or a skipped zero: no verdict
                        firing = compare(v, params.op, params.value)
                        if not firing and (held is None or (rank, extra) not in held):
                            continue  # a quiet value of a series the alert does not hold: no change
                        verdict = Verdict(firing, v, params.value)
                    done_key = (c.idx, series_labels)
                    sample = (step, last[1])
                    if done.get(done_key) == sample:
                        continue  # judged already, at an earlier frame of this step
                    done[done_key] = sample
                    if not c.fast:
                        window = series.window(c.samples, copy=False)  # read before any append
                        cctx = self._context(
                            c.rule, labels, step, t, lr_change, extra, nonfinite, amp_skipped, note
                        )
                        cctx.lr_fraction = lr_fraction
                        cctx.lr_change_step = lr_change
                        cctx.guard_skipped = guard_skipped
                        if c.spec.quiet is not None:
                            if memo is None:
                                memo = memos[(c.idx, series_labels)] = {}
                            memo.pop("base", None)  # fn leaves a new one, or none to go by
                            memo["count"] = series.count
                            cctx.memo = memo
                        verdict = c.spec.fn(window, params, cctx)
                        self.evaluations += 1
                    life.observe(c.rule, job, run, rank, extra, verdict, step, now, one)
                if sampled and c.every > 1:
                    judged[c.idx] = (step, frame)
                touched.append(name)
            for c in self._time_rules if only is None else ():
                # a new frame ends any stall of this rank: judge it now, not at the next tick
                if life.tracks(c.rule.name, job, run, rank):
                    self._time_eval(c, job, run, rank, rs, t, now)
                    touched.append(c.rule.name)
            out: list[Transition] = []
            for name in touched:
                if life.is_open(name, job, run):
                    out += life.settle(name, job, run, now, ranks)
            out += life.flush(now)
            return out

    def tick(self, now: float | None = None) -> list[Transition]:
        """Evaluate the time-based rules for every known rank; fire alerts whose group
        wait has passed. Call about once a second.

        Args:
            now: the current time (default: the engine's clock).
        """
        with self._lock:
            now = self._clock() if now is None else now
            out: list[Transition] = []
            for (job, run), ranks in list(self._runs.items()):
                streams = sorted((k[2], k[3]) for k in self._ranks if k[0] == job and k[1] == run)
                for c in self._time_rules:
                    for rank, opt in streams:
                        rs = self._rank(job, run, rank, opt)
                        if rs.last_step < c.gate_until:
                            continue
                        self._time_eval(c, job, run, rank, rs, now, now)
                    if self._life.is_open(c.rule.name, job, run):
                        out += self._life.settle(c.rule.name, job, run, now, ranks)
            out += self._life.flush(now)
            return out

    def evaluate_gpus(self, node: str, now: float | None = None) -> list[Transition]:
        """Judge the ``per: gpu`` rules on every new sample of the node's GPU series (the
        NVML poller's). Their alerts belong to job ``"node"`` and run ``node``, and list
        the GPUs (``GPU <index> (<UUID>)``) as their groups. Call on the engine's tick."""
        with self._lock:
            now = self._clock() if now is None else now
            store, life, out = self.store, self._life, []
            for c in self._gpu_rules:
                for m in c.rule.metrics:
                    labelsets = store.labelsets(m)
                    if labelsets:
                        break
                for ls in labelsets:
                    series = store.series(m, ls)
                    last = None if series is None else series.last()
                    if series is None or last is None:
                        continue
                    key = (c.idx, ls)
                    if self._done.get(key) == (last[0], last[1]):
                        continue  # judged at an earlier tick
                    self._done[key] = (last[0], last[1])
                    d = dict(ls)
                    verdict = c.spec.fn(series.window(c.samples), c.params, Context(step=last[0], now=now, series=d))
                    self.evaluations += 1
                    gpu = (("group", f"GPU {d.get('gpu', '?')} ({d.get('UUID', '?')})"),)
                    life.observe(c.rule, NODE_JOB, node, NO_RANK, gpu, verdict, last[0], now)
                if life.is_open(c.name, NODE_JOB, node):
                    out += life.settle(c.name, NODE_JOB, node, now)
            return out + life.flush(now)

    def retire(
        self, job: str, run: str, rank: int | None = None, now: float | None = None,
        keep: Collection[str] = (),
    ) -> list[Transition]:
        """Stop watching one rank (or the whole run) that ended; resolve its alerts but
        those of the rules in ``keep``.

        Without this, a run that finished cleanly would look stalled.
        """
        with self._lock:
            now = self._clock() if now is None else now
            out = self._life.drop(job, run, rank, now, keep)
            ranks = self._runs.get((job, run), set())
            gone = set(ranks) if rank is None else {rank}
            ranks -= gone
            if not ranks:
                self._runs.pop((job, run), None)
            for key in [k for k in self._ranks if k[0] == job and k[1] == run and k[2] in gone]:
                del self._ranks[key]  # every stream of the rank
            gone_pairs = {("rank", str(r)) for r in gone}
            for table in (self._done, self._memos):
                for dk in [k for k in table if ("job", job) in k[1] and ("run", run) in k[1]]:
                    if any(p in gone_pairs for p in dk[1]):
                        del table[dk]
            return out

    def active(self) -> list[dict[str, Any]]:
        """Pending and firing alerts as JSON-ready dicts (see ``Alert.to_json``), firing first."""
        with self._lock:
            return [a.to_json() for a in self._life.active()]

    def recent(self) -> list[dict[str, Any]]:
        """Recently resolved alerts as JSON-ready dicts, newest first."""
        with self._lock:
            return [a.to_json() for a in self._life.recent()]

    def rules_reading(self, metrics: Collection[str]) -> list[str]:
        """The names of the enabled rules that read any of ``metrics``."""
        return [c.name for c in self._step_rules + self._time_rules if set(c.rule.metrics) & set(metrics)]

    def rules_of_kind(self, kind: str) -> list[str]:
        """The names of the enabled rules with detector ``kind``."""
        return [c.name for c in self._step_rules + self._time_rules if c.rule.kind == kind]

    def ranks(self, job: str, run: str) -> set[int]:
        """The ranks of a run being watched (reported and not retired)."""
        with self._lock:
            return set(self._runs.get((job, run), ()))

    def last_step(self, job: str, run: str, rank: int) -> int | None:
        """The step of the rank's last evaluated frame (the furthest of its streams), or None."""
        with self._lock:
            steps = [rs.last_step for k, rs in self._ranks.items() if k[0] == job and k[1] == run and k[2] == rank]
            return max(steps) if steps else None

    def firing_series(self) -> list[tuple[dict[str, str], float]]:
        """``(labels, value)`` rows for ``sentinel_alert_firing{alertname,severity,job,run}``."""
        with self._lock:
            return self._life.firing_series()

    # -- internals ---------------------------------------------------------------

    def _rank(self, job: str, run: str, rank: int, opt: str = "") -> RankState:
        rk = (job, run, rank, opt)
        rs = self._ranks.get(rk)
        if rs is None:
            labels = labels_of(job=job, run=run, rank=rank, optimizer=opt) if opt else labels_of(
                job=job, run=run, rank=rank)
            rs = self._ranks[rk] = RankState(labels, self._n_rules, opt)
        return rs

    def _context(
        self,
        r: Rule,
        labels: Labels,
        step: int,
        t: float,
        lr_change: int | None,
        extra: Labels,
        nonfinite: Mapping[str, Sequence[str]],
        amp_skipped: bool,
        note: str = "",
    ) -> Context:
        reference = None
        if r.reference is not None:
            ref = self.store.last(r.reference, labels)
            reference = None if ref is None else ref[2]
        return Context(
            step=step,
            now=t,
            since_step=max(r.warmup_steps, (lr_change or 0) if r.lr_resets_baseline else 0),
            reference=reference,
            series=dict(extra) if extra else _NO_LABELS,
            nonfinite_groups=nonfinite,
            amp_skipped=amp_skipped,
            note=note,
        )

    def _time_eval(
        self, c: Compiled, job: str, run: str, rank: int, rs: RankState, t: float, now: float
    ) -> None:
        step = rs.last_step
        sel = rs.sel[c.idx]
        if sel is None or sel.generation != self.store.generation or not 0 <= step - sel.refreshed < self._refresh:
            sel = select(c, self.store, job, run, rank, rs, step)
        if sel.metric is None:
            return
        for _, extra, series in sel.series:
            window = series.window(c.samples)
            cctx = Context(step=step, now=t, series=dict(extra))
            verdict = c.spec.fn(window, c.rule.params, cctx)
            self.evaluations += 1
            self._life.observe(c.rule, job, run, rank, extra, verdict, step, now)
