"""The rule engine: runs the enabled rules of a pack against the store, per ingested frame.

The engine calls :meth:`RuleEngine.evaluate` after it has written one step frame of one
rank to the store, and :meth:`RuleEngine.tick` about once a second for the time-based
rules (stalls) and for alerts waiting for other ranks. Both return the transitions made,
which the caller stores and delivers.

Cost (the judging itself is :mod:`sentinel.rules.judge`'s): a rule is evaluated for a series only when that series got a new sample at this
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

from sentinel.rules.base import Context
from sentinel.rules.compiled import Compiled, RankState, compile_rule
from sentinel.rules.config import RulePack
from sentinel.rules.ingested import Ingested
from sentinel.rules.judge import Evaluation, Judge
from sentinel.rules.lifecycle import Lifecycle, Transition
from sentinel.rules.stall import siblings_stepped
from sentinel.store import Store, labels_of

AMP_SKIPS = "sentinel_amp_skipped_steps_total"
HEARTBEAT = "sentinel_last_heartbeat_timestamp_seconds"
STEP = "sentinel_step"
NODE_JOB = "node"
"""The job of alerts about the machine rather than a training run (GPU health)."""
NO_RANK = -1
"""The rank of series that belong to no rank; never listed in an alert's ranks."""
_NO_GROUPS: Mapping[str, Sequence[str]] = {}


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
        self._life = Lifecycle(recent_limit)
        self._lock = threading.RLock()
        compiled = [compile_rule(i, r) for i, r in enumerate(pack.enabled())]
        self._gpu_rules = [c for c in compiled if c.rule.per == "gpu"]
        self._step_rules = [c for c in compiled if not c.spec.time_based and c.rule.per != "gpu"]
        self._time_rules = [c for c in compiled if c.spec.time_based and c.rule.per != "gpu"]
        self._n_rules = len(compiled)
        self._runs: dict[tuple[str, str], set[int]] = {}
        self._ranks: dict[tuple[str, str, int, str], RankState] = {}  # (job, run, rank, stream)
        self._judge = Judge(store, self._life, refresh_steps)
        # the process a stream reports from, (job, run, rank, stream) -> pid, where the
        # transport knows it (the engine sets it; None: taken for one process per rank)
        self.process_of: Callable[[tuple[str, str, int, str]], int | None] = lambda key: None
        # where a stream's training thread was while no step came, (job, run, rank, stream) -> text
        self.where_of: Callable[[tuple[str, str, int, str]], str | None] = lambda key: None
        # the step rules to consider per (gauges written, only): see _candidates
        self._cands: dict[tuple[frozenset[str] | None, tuple[str, ...] | None], list[Compiled]] = {}

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
            ev = self._begin(job, run, rank, step, t, ctx or Ingested(), only is None, opt)
            judge = self._judge
            touched = judge.judge_due(ev, judge.due(ev, self._candidates(ev.written, only)))
            if only is None:
                self._time_rules_on_frame(ev, touched)
            return self._settle(ev, touched)

    def _begin(self, job: str, run: str, rank: int, step: int, t: float, ctx: Ingested,
               own_frame: bool, opt: str = "") -> Evaluation:
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
        return Evaluation(job, run, rank, step, t, now, rs, ranks, amp_skipped, ctx.lr_change_step, ctx.lr_fraction,
                      ctx.nonfinite_groups or _NO_GROUPS, ctx.note or "", ctx.written, self._life.open_in(job, run),
                      ctx.guard_skipped, ctx.lr_restart_step, ctx.short_batch, ctx.rewrite_step, ctx.loss_start,
                      ctx.game)

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

    def _time_rules_on_frame(self, ev: Evaluation, touched: list[str]) -> None:
        """A new frame ends any stall of this rank: judge the time-based rules whose
        alert holds it now, not at the next tick."""
        life, opened = self._life, ev.opened
        beat: float | None | bool = False  # looked up once, for the first rule that needs it
        for c in self._time_rules:
            if c.name in opened and life.tracks(c.name, ev.job, ev.run, ev.rank):
                if beat is False:
                    beat = self._heartbeat(ev.job, ev.run)
                self._time_eval(c, ev.job, ev.run, ev.rank, ev.rs, ev.t, ev.now, beat)
                touched.append(c.rule.name)

    def _settle(self, ev: Evaluation, touched: list[str]) -> list[Transition]:
        """Move the open alerts of the rules judged to the states their series call for,
        then fire those whose group wait has passed."""
        life, opened = self._life, ev.opened
        out: list[Transition] = []
        for name in touched:
            if name in opened:
                out += life.settle(name, ev.job, ev.run, ev.now, ev.ranks)
        out += life.flush(ev.now)
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
                beat = self._heartbeat(job, run) if self._time_rules else None
                siblings = self._siblings_stepped(job, run, streams) if self._time_rules else {}
                for c in self._time_rules:
                    for rank, opt in streams:
                        rs = self._rank(job, run, rank, opt)
                        if rs.last_step < c.gate_until:
                            continue
                        self._time_eval(c, job, run, rank, rs, now, now, beat, siblings.get((rank, opt)))
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
                    if not self._judge.fresh((c.idx, ls), (last[0], last[1])):
                        continue  # judged at an earlier tick
                    d = dict(ls)
                    verdict = c.spec.fn(series.window(c.samples), c.params, Context(step=last[0], now=now, series=d))
                    self._judge.evaluations += 1
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
            self._judge.forget(job, run, gone)
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

    @property
    def evaluations(self) -> int:
        """Verdicts taken (rule × series), for ``sentinel_daemon_rule_evaluations_total``."""
        return self._judge.evaluations

    # -- internals ---------------------------------------------------------------

    def _rank(self, job: str, run: str, rank: int, opt: str = "") -> RankState:
        rk = (job, run, rank, opt)
        rs = self._ranks.get(rk)
        if rs is None:
            labels = labels_of(job=job, run=run, rank=rank, optimizer=opt) if opt else labels_of(
                job=job, run=run, rank=rank)
            rs = self._ranks[rk] = RankState(labels, self._n_rules, opt)
        return rs

    def _heartbeat(self, job: str, run: str) -> float | None:
        """The latest heartbeat of any rank of the run (None: none yet). Run-wide: while
        rank 0 evaluates alone, the other ranks wait for it in a collective, and are no
        more stalled than it is."""
        store = self.store
        times = [last[1] for k, rs in self._ranks.items() if k[0] == job and k[1] == run
                 for last in (store.last(HEARTBEAT, rs.labels),) if last is not None]
        return max(times) if times else None

    def _siblings_stepped(self, job: str, run: str, streams: list[tuple[int, str]]) -> dict[tuple[int, str], float]:
        """Per stream of a rank with several (one per optimizer), the time of the latest
        step of another stream of the same process (:func:`~sentinel.rules.stall.siblings_stepped`):
        a layer-wise script (the PyTorch examples' Forward-Forward: one Adam per layer, each
        trained in turn) or a phase whose optimizer is done while the next one trains is no
        hang of the first."""
        if len({rank for rank, _ in streams}) == len(streams):
            return {}  # one stream per rank: no siblings
        store, ranks, process_of = self.store, self._ranks, self.process_of
        last = {(rank, opt): got[1] for rank, opt in streams
                for got in (store.last(STEP, ranks[(job, run, rank, opt)].labels),) if got is not None}
        return siblings_stepped(last, lambda k: process_of((job, run, *k)))

    def _time_eval(
        self, c: Compiled, job: str, run: str, rank: int, rs: RankState, t: float, now: float,
        beat: float | None = None, sibling: float | None = None,
    ) -> None:
        step = rs.last_step
        sel = self._judge.selection(c, job, run, rank, rs, step)
        if sel.metric is None:
            return
        for _, extra, series in sel.series:
            window = series.window(c.samples)
            cctx = Context(step=step, now=t, series=dict(extra), heartbeat=beat, sibling_step=sibling,
                           where=self.where_of((job, run, rank, rs.opt)))
            verdict = c.spec.fn(window, c.rule.params, cctx)
            self._judge.evaluations += 1
            self._life.observe(c.rule, job, run, rank, extra, verdict, step, now)
