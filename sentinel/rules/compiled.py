"""A rule pack compiled for the evaluator's hot loop, and what the evaluator keeps per rank."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from sentinel.rules.base import DetectorSpec
from sentinel.rules.config import Rule
from sentinel.rules.registry import DETECTORS
from sentinel.rules.threshold import ThresholdParams
from sentinel.store import Column, Labels, Series, Store

_IDENTITY = ("job", "run", "rank")

@dataclass(frozen=True)
class Compiled:
    idx: int
    rule: Rule
    spec: DetectorSpec
    samples: int
    offset: int  # phase of every_steps, so heavy rules don't all land on the same step
    fast: bool  # threshold on the latest value: no window needed
    metrics: frozenset[str]
    # flattened for the hot loop
    name: str
    gate_until: int  # no verdict before this step (warm-up; 0 for critical rules)
    every: int
    grace: int
    params: Any
    until: int = 0  # no verdict after this step unless an alert is open (0: no end)
    floor: float = 0.0  # no verdict while the lr is below this fraction of its peak
    warmup: int = 0  # rule.warmup_steps
    lr_resets: bool = False  # rule.lr_resets_baseline
    lr_for: int = 0  # rule.lr_for_steps
    plain: bool = False  # no phase, early end, grace, schedule floor or batch check: due whenever past its gate
    restart: int = 0  # rule.restart_grace_steps
    short: bool = False  # rule.skip_short_batch
    games: bool = False  # rule.skip_games


@dataclass
class Selection:
    refreshed: int
    generation: int  # the store's generation when selected
    metric: str | None
    series: list[tuple[Labels, Labels, Series | Column]]  # (labels, labels beyond job/run/rank, series)


class RankState:
    """What the engine keeps per rank (per optimizer stream of a rank, for a process with
    several): its labels, progress and per-rule lookups."""

    __slots__ = ("labels", "opt", "last_step", "frames", "amp", "sel", "judged")

    def __init__(self, labels: Labels, rules: int, opt: str = "") -> None:
        self.labels = labels
        self.opt = opt  # the stream's ``optimizer`` label ("": the rank's only stream)
        self.last_step = 0
        self.frames = 0  # frames evaluated
        self.amp = 0.0  # AMP skipped steps seen
        self.sel: list[Selection | None] = [None] * rules  # by rule index
        # (step, frame number) at which each rule last judged any series of the rank
        self.judged: list[tuple[int, int] | None] = [None] * rules


def compile_rule(idx: int, rule: Rule) -> Compiled:
    spec = DETECTORS[rule.kind]
    p = rule.params
    fast = (isinstance(p, ThresholdParams) and p.reduce == "last" and p.unless_reference is None
            and p.while_reference_below is None and not p.step_share)
    offset = zlib.crc32(rule.name.encode()) % rule.every_steps
    gate = 0 if rule.severity == "critical" else rule.warmup_steps
    return Compiled(
        idx, rule, spec, max(1, p.samples()), offset, fast, frozenset(rule.metrics),
        rule.name, gate, rule.every_steps, rule.lr_grace_steps, p, rule.until_steps,
        rule.schedule_floor, rule.warmup_steps, rule.lr_resets_baseline, rule.lr_for_steps,
        rule.every_steps <= 1 and not rule.until_steps and not rule.lr_grace_steps and not rule.schedule_floor
        and not rule.restart_grace_steps and not rule.skip_short_batch and not rule.skip_games,
        rule.restart_grace_steps, rule.skip_short_batch, rule.skip_games,
    )  # fmt: skip


def select(c: Compiled, store: Store, job: str, run: str, rank: int, rs: RankState, step: int) -> Selection:
    """Look up (again) the series of ``c.rule`` for one rank: those of the first of
    its metrics the rank reports. Cached in ``rs.sel``.

    A stream of a process with several optimizers (``rs.opt``) reads only the series
    labelled with its ``optimizer``; a rank's only stream reads those without one. The
    ``optimizer`` label stays among the extra labels, so the streams' series are apart in
    an alert too."""
    r, labels = c.rule, rs.labels
    gen = store.generation
    rank_pair, run_pair, job_pair = ("rank", str(rank)), ("run", run), ("job", job)
    opt = rs.opt
    opt_pair = ("optimizer", opt)
    sel = Selection(step, gen, None, [])
    for m in r.metrics:
        if r.per == "rank":
            obj = store.series(m, labels)
            if obj is not None:
                sel = Selection(step, gen, m, [(labels, (opt_pair,) if opt else (), obj)])
                break
        found = []
        for ls in store.labelsets(m):
            if rank_pair in ls and run_pair in ls and job_pair in ls:
                if (opt_pair not in ls) if opt else any(k == "optimizer" for k, _ in ls):
                    continue  # another stream's
                extra = tuple(p for p in ls if p[0] not in _IDENTITY)
                if r.per == "group" and not any(k == "group" for k, _ in extra):
                    continue
                obj = store.series(m, ls)
                if obj is not None:
                    found.append((ls, extra, obj))
        if found:
            sel = Selection(step, gen, m, found)
            break
    rs.sel[c.idx] = sel
    return sel
