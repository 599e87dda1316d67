"""Judging one frame's due rules on a rank's series: the evaluator's hot loop.

:class:`~sentinel.rules.evaluator.RuleEngine` picks the rules a frame can concern and
hands them here with what the frame told (an :class:`Evaluation`). A rule is *due* when it
is past its warm-up and on its ``every_steps`` phase (or catching up); each of its series
with a sample at this step is judged once per sample: a shortcut first (``idle``, ``quiet``,
the inlined threshold), the detector on its window only when the shortcut cannot say. The
verdicts go to the life cycle (:mod:`sentinel.rules.lifecycle`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sentinel.rules.base import Context, Verdict
from sentinel.rules.compiled import Compiled, RankState, Selection, select
from sentinel.rules.config import Rule
from sentinel.rules.lifecycle import Alert, Lifecycle
from sentinel.rules.threshold import compare
from sentinel.store import Column, Labels, Series, Store

_NO_LABELS: Mapping[str, str] = {}  # shared: detectors never modify their context


@dataclass(slots=True)
class Evaluation:
    """What the steps of one :meth:`~sentinel.rules.evaluator.RuleEngine.evaluate` share."""

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
    opened: Mapping[str, Alert]  # the run's open alerts by rule (a live view)
    guard_skipped: bool = False  # the step guard kept this step out of the weights
    lr_restart: int | None = None  # the last warm restart of the rank's schedule, or weights the script set
    short_batch: bool = False  # the step's batch was its loader's short last one
    rewrite: int | None = None  # the last step whose weights the script had set itself
    loss_start: float | None = None  # the level the stream's loss began at (Ingested.loss_start)
    game: bool = False  # the stream plays a game (Ingested.game)



class Judge:
    """Judges due rules for one rank at a time, and remembers per rule and series what was
    judged (each sample once) and what a detector's ``quiet`` shortcut goes by.

    Args:
        store: the series.
        life: where verdicts go.
        refresh_steps: how often (in steps) a rank's series list per rule is re-read.
    """

    def __init__(self, store: Store, life: Lifecycle, refresh_steps: int) -> None:
        self.store = store
        self._life = life
        self._refresh = refresh_steps
        # the last sample judged, as its (step, time), per rule and series
        self._done: dict[tuple[int, Labels], tuple[int, float]] = {}
        # what a detector with a quiet() shortcut left at its last full evaluation, per series
        self._memos: dict[tuple[int, Labels], dict[str, Any]] = {}
        self.evaluations = 0  # verdicts taken (rule × series), for sentinel_daemon_rule_evaluations_total

    def selection(self, c: Compiled, job: str, run: str, rank: int, rs: RankState, step: int) -> Selection:
        """The rank's series of rule ``c``: looked up again when the store has a new series
        (the rule's may be among them) and every ``refresh_steps``."""
        sel = rs.sel[c.idx]
        if sel is None or sel.generation != self.store.generation or not 0 <= step - sel.refreshed < self._refresh:
            sel = select(c, self.store, job, run, rank, rs, step)
        return sel

    def fresh(self, key: tuple[int, Labels], sample: tuple[int, float]) -> bool:
        """Whether ``sample`` of the series ``key`` (rule index, labels) is not judged yet;
        it counts as judged from now on."""
        if self._done.get(key) == sample:
            return False
        self._done[key] = sample
        return True

    def forget(self, job: str, run: str, ranks: set[int]) -> None:
        """Drop what is kept for the series of these ranks of a run."""
        gone_pairs = {("rank", str(r)) for r in ranks}
        for table in (self._done, self._memos):
            for dk in [k for k in table if ("job", job) in k[1] and ("run", run) in k[1]]:
                if any(p in gone_pairs for p in dk[1]):
                    del table[dk]

    def due(self, ev: Evaluation, candidates: list[Compiled]) -> list[Compiled]:
        """The candidates judged at this frame: not warming up, past their early phase, off
        their every_steps phase, in their lr or warm-restart grace, at a short batch's step
        or under their schedule floor."""
        step, lr_change, lr_fraction, opened = ev.step, ev.lr_change, ev.lr_fraction, ev.opened
        restart, short, game = ev.lr_restart, ev.short_batch, ev.game
        judged, frames = ev.rs.judged, ev.rs.frames
        out = []
        for c in candidates:
            if step < c.gate_until:
                continue  # warming up
            if c.plain:
                out.append(c)
                continue
            if c.until and step > c.until and c.name not in opened:
                continue  # an early-phase check, over (an open alert is judged until it resolves)
            if c.every > 1 and (step + c.offset) % c.every:
                # off its phase: run only to catch up (a sparse series, a frozen step)
                seen = judged[c.idx]
                if seen is not None and step - seen[0] < c.every and frames - seen[1] < 2 * c.every:
                    continue
            if c.grace and lr_change is not None and lr_change <= step < lr_change + c.grace:
                continue
            if c.restart and restart is not None and restart <= step < restart + c.restart:
                continue  # climbing out of the minimum a warm restart kicked it from: by design
            if c.short and short:
                continue  # a few samples' gradient and loss: no spike of the run's
            if c.games and game:
                continue  # a player's gradients follow the other player's moves
            if c.floor and lr_fraction is not None and lr_fraction < c.floor:
                continue  # the schedule has taken the lr far below its peak: expected
            out.append(c)
        return out

    def judge_due(self, ev: Evaluation, due: list[Compiled]) -> list[str]:
        """Judge each due rule on the rank's series; the names of those judged, in order."""
        touched: list[str] = []
        for c in due:
            sel = self.selection(c, ev.job, ev.run, ev.rank, ev.rs, ev.step)
            if sel.metric is None:
                continue  # nothing to judge for this rank (yet)
            self.judge(c, sel, ev)
            touched.append(c.name)
        return touched

    def judge(self, c: Compiled, sel: Selection, ev: Evaluation) -> None:
        """Judge rule ``c`` on each of its series that got a sample at this step, once per
        sample, and hand the verdicts to the life cycle."""
        step, params, spec = ev.step, c.params, c.spec
        # with no open alert only a firing verdict changes anything, so a value
        # that cannot fire (spec.idle, spec.quiet) needs no window and no verdict
        alert = ev.opened.get(c.name)
        held = None if alert is None else alert.series
        idle = quiet = None
        if held is None:
            idle, quiet = spec.idle, spec.quiet
        lr_change = ev.lr_change
        since = max(c.warmup, (lr_change or 0) if c.lr_resets else 0)
        if c.restart and ev.lr_restart is not None:  # baselines begin after a warm restart's grace
            since = max(since, ev.lr_restart + c.restart)
        memos = self._memos
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
            verdict: Verdict | None = None
            if c.fast:  # check() inlined: most values are quiet and need no Verdict
                self.evaluations += 1
                v = last[2]
                if v != v or (params.skip_zero and v == 0.0):
                    continue  # NaN or a skipped zero: no verdict
                firing = compare(v, params.op, params.value)
                if not firing and (held is None or (ev.rank, extra) not in held):
                    continue  # a quiet value of a series the alert does not hold: no change
                verdict = Verdict(firing, v, params.value)
            if not self.fresh((c.idx, series_labels), (step, last[1])):
                continue  # judged already, at an earlier frame of this step
            if not c.fast:
                verdict = self.verdict(c, ev, series_labels, extra, series, memo)
            if verdict is None or (held is None and not verdict.firing):
                continue  # no alert to move, none to open: the life cycle would do nothing
            lr_for = c.lr_for
            one = 1 if lr_for and lr_change is not None and lr_change <= step < lr_change + lr_for else None
            self._life.observe(c.rule, ev.job, ev.run, ev.rank, extra, verdict, step, ev.now, one)
        if sampled and c.every > 1:
            ev.rs.judged[c.idx] = (step, ev.rs.frames)

    def verdict(self, c: Compiled, ev: Evaluation, series_labels: Labels, extra: Labels, series: Series | Column,
                 memo: dict[str, Any] | None) -> Verdict | None:
        """The detector's full verdict on one series' window (the memo it keeps renewed)."""
        window = series.window(c.samples, copy=False)  # read before any append
        lr_change = ev.lr_change
        cctx = self.context(c.rule, ev.rs.labels, ev.step, ev.t, lr_change, extra, ev.nonfinite, ev.amp_skipped,
                             ev.note)
        if c.restart and ev.lr_restart is not None:
            cctx.since_step = max(cctx.since_step, ev.lr_restart + c.restart)
        cctx.lr_fraction = ev.lr_fraction
        cctx.lr_change_step = lr_change
        cctx.guard_skipped = ev.guard_skipped  # the step guard kept this step out
        cctx.rewrite_step = ev.rewrite
        cctx.loss_start = ev.loss_start
        if c.rule.reference is not None and (n := c.params.reference_samples()) > 0:
            cctx.reference_window = self.store.window(c.rule.reference, ev.rs.labels, n)
        if c.spec.quiet is not None:
            if memo is None:
                memo = self._memos[(c.idx, series_labels)] = {}
            memo.pop("base", None)  # fn leaves a new one, or none to go by
            memo["count"] = series.count
            cctx.memo = memo
        elif c.spec.memo:
            cctx.memo = self._memos.setdefault((c.idx, series_labels), {})
        self.evaluations += 1
        return c.spec.fn(window, c.params, cctx)

    def context(
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
        """What the detector of rule ``r`` may know of one series' evaluation besides its window."""
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
