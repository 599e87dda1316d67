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
from dataclasses import dataclass
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from sentinel.rules.ingested import Ingested
from sentinel.store import Labels, Store, labels_of
from sentinel.rules.base import Context, Verdict
from sentinel.rules.compiled import Compiled, RankState, Selection, compile_rule, select
from sentinel.rules.config import Rule, RulePack
from sentinel.rules.lifecycle import Lifecycle, Transition
from sentinel.rules.threshold import compare

AMP_SKIPS = "sentinel_amp_skipped_steps_total"
NODE_JOB = "node"
"""The job of alerts about the machine rather than a training run (GPU health)."""
_NO_LABELS: Mapping[str, str] = {}  # shared: detectors never modify their context
NO_RANK = -1
"""The rank of series that belong to no rank; never listed in an alert's ranks."""
_NO_GROUPS: Mapping[str, Sequence[str]] = {}


@dataclass(slots=True)
class _Frame:
    """What the steps of one :meth:`RuleEngine.evaluate` share."""

    job: str
    run: str
    rank: int
    step: int
    t: float
    now: float
    rs: RankState
    ranks: set[int]  # the run's ranks being watched
    amp_skipped: bool
    lr_change: int | None
    lr_fraction: float | None
    nonfinite: Mapping[str, Sequence[str]]
    note: str
    written: frozenset[str] | None
    guard_skipped: bool = False  # the step guard kept this step out of the weights


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
        # the step rules to consider per (gauges written, only): see _candidates
        self._cands: dict[tuple[frozenset[str] | None, tuple[str, ...] | None], list[Compiled]] = {}
        self.evaluations = 0  # verdicts taken (rule × series), for sentinel_daemon_rule_evaluations_total

    def evaluate(
        self,
        job: str,
        run: str,
        rank: int,
        step: int,
        t: float,
        ctx: Ingested | None = None,
        only: Collection[str] | None = None,
        opt: str = "",
    ) -> list[Transition]:
        """Evaluate the step-driven rules for one rank after its frame for ``step``.

        Args:
            t: the frame's wall-clock time.
            ctx: what ingesting the frame found (:class:`Ingested`): its non-finite
                groups, the gauges it wrote (other rules are skipped; None: judge all),
                the last learning-rate change, the lr over its peak, and a ``note`` for
                detectors that print one (``Context.note``). None: nothing of the kind.
            only: evaluate just these rules (e.g. the cross-rank ones, for a rank whose
                frame for ``step`` was judged already).
            opt: the frame's optimizer stream (``""``: the rank's only one).

        Returns:
            Transitions to firing or resolved, in order.
        """
        with self._lock:
            fr = self._begin(job, run, rank, step, t, ctx or Ingested(), only is None, opt)
            touched = self._judge_due(fr, self._due(fr, self._candidates(fr.written, only)))
            if only is None:
                self._time_rules_on_frame(fr, touched)
            return self._settle(fr, touched)

    def _begin(self, job: str, run: str, rank: int, step: int, t: float, ctx: Ingested,
               own_frame: bool, opt: str = "") -> _Frame:
        """Note the rank (its optimizer stream) and its progress; gather what every rule of
        this evaluation reads."""
        now = self._clock()
        rs = self._rank(job, run, rank, opt)
        ranks = self._runs.get((job, run))
        if ranks is None:
            ranks = self._runs[(job, run)] = set()
        ranks.add(rank)
        amp_skipped = False
        if own_frame:  # a frame of this rank (not a re-evaluation for other ranks' data)
            rs.last_step = step
            rs.frames += 1
            skips = self.store.counter(AMP_SKIPS, rs.labels)
            amp_skipped = skips > rs.amp
            rs.amp = skips
        return _Frame(job, run, rank, step, t, now, rs, ranks, amp_skipped, ctx.lr_change_step, ctx.lr_fraction,
                      ctx.nonfinite_groups or _NO_GROUPS, ctx.note or "", ctx.written, ctx.guard_skipped)

    def _candidates(self, written: frozenset[str] | None, only: Collection[str] | None) -> list[Compiled]:
        """The step rules to consider, in pack order: those in ``only`` (all by default)
        reading a metric among ``written`` (all when None). Cached per combination."""
        key = (written, None if only is None else tuple(only))
        out = self._cands.get(key)
        if out is None:
            if len(self._cands) > 256:
                self._cands.clear()
            out = self._cands[key] = [
                c for c in self._step_rules
                if (only is None or c.name in only) and (written is None or not c.metrics.isdisjoint(written))
            ]
        return out

    def _due(self, fr: _Frame, candidates: list[Compiled]) -> list[Compiled]:
        """The candidates judged at this frame: not warming up, past their early phase, off
        their every_steps phase, in their lr grace or under their schedule floor."""
        step, lr_change, lr_fraction, life = fr.step, fr.lr_change, fr.lr_fraction, self._life
        judged, frames = fr.rs.judged, fr.rs.frames
        out = []
        for c in candidates:
            if step < c.gate_until:
                continue  # warming up
            if c.until and step > c.until and not life.is_open(c.name, fr.job, fr.run):
                continue  # an early-phase check, over (an open alert is judged until it resolves)
            if c.every > 1 and (step + c.offset) % c.every:
                # off its phase: run only to catch up (a sparse series, a frozen step)
                seen = judged[c.idx]
                if seen is not None and step - seen[0] < c.every and frames - seen[1] < 2 * c.every:
                    continue
            if c.grace and lr_change is not None and lr_change <= step < lr_change + c.grace:
                continue
            if c.floor and lr_fraction is not None and lr_fraction < c.floor:
                continue  # the schedule has taken the lr far below its peak: expected
            out.append(c)
        return out

    def _judge_due(self, fr: _Frame, due: list[Compiled]) -> list[str]:
        """Judge each due rule on the rank's series; the names of those judged, in order."""
        touched: list[str] = []
        gen, refresh, sels, step = self.store.generation, self._refresh, fr.rs.sel, fr.step
        for c in due:
            sel = sels[c.idx]
            # looked up again when the store has a new series (the rule's may be among
            # them) and every refresh_steps
            if sel is None or sel.generation != gen or not 0 <= step - sel.refreshed < refresh:
                sel = select(c, self.store, fr.job, fr.run, fr.rank, fr.rs, step)
            if sel.metric is None:
                continue  # nothing to judge for this rank (yet)
            self._judge(c, sel, fr)
            touched.append(c.name)
        return touched

    def _judge(self, c: Compiled, sel: Selection, fr: _Frame) -> None:
        """Judge rule ``c`` on each of its series that got a sample at this step, once per
        sample, and hand the verdicts to the life cycle."""
        life, done, memos = self._life, self._done, self._memos
        job, run, rank, step, lr_change = fr.job, fr.run, fr.rank, fr.step, fr.lr_change
        name, params = c.name, c.params
        # with no open alert only a firing verdict changes anything, so a value
        # that cannot fire (spec.idle) needs no window and no verdict
        held = life.open_series(name, job, run)
        spec = c.spec
        idle = None if held is not None else spec.idle
        quiet = None if held is not None else spec.quiet
        since = max(c.warmup, (lr_change or 0) if c.lr_resets else 0)
        lr_for = c.lr_for
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
            if spec.quiet is not None:
                memo = memos.get((c.idx, series_labels))
                # a memo holds for the baseline start it was taken with; one with "lr" and
                # "step" (trend's) also for that lr change only, and samples at later steps
                if (quiet is not None and memo is not None and memo.get("since") == since
                        and memo.get("lr", lr_change) == lr_change and memo.get("step", -1) < last[0]
                        and quiet(last[2], params, memo, series.count - memo["count"])):
                    if "step" in memo:
                        memo["step"] = last[0]
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
                    c.rule, fr.rs.labels, step, fr.t, lr_change, extra, fr.nonfinite, fr.amp_skipped, fr.note
                )
                cctx.lr_fraction = fr.lr_fraction
                cctx.lr_change_step = lr_change
                cctx.guard_skipped = fr.guard_skipped  # the step guard kept this step out
                if spec.quiet is not None:
                    if memo is None:
                        memo = memos[(c.idx, series_labels)] = {}
                    memo.pop("base", None)  # fn leaves a new one, or none to go by
                    memo["count"] = series.count
                    cctx.memo = memo
                verdict = spec.fn(window, params, cctx)
                self.evaluations += 1
            life.observe(c.rule, job, run, rank, extra, verdict, step, fr.now, one)
        if sampled and c.every > 1:
            fr.rs.judged[c.idx] = (step, fr.rs.frames)

    def _time_rules_on_frame(self, fr: _Frame, touched: list[str]) -> None:
        """A new frame ends any stall of this rank: judge the time-based rules whose
        alert holds it now, not at the next tick."""
        life = self._life
        for c in self._time_rules:
            if life.tracks(c.rule.name, fr.job, fr.run, fr.rank):
                self._time_eval(c, fr.job, fr.run, fr.rank, fr.rs, fr.t, fr.now)
                touched.append(c.rule.name)

    def _settle(self, fr: _Frame, touched: list[str]) -> list[Transition]:
        """Move the open alerts of the rules judged to the states their series call for,
        then fire those whose group wait has passed."""
        life = self._life
        out: list[Transition] = []
        for name in touched:
            if life.is_open(name, fr.job, fr.run):
                out += life.settle(name, fr.job, fr.run, fr.now, fr.ranks)
        out += life.flush(fr.now)
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
