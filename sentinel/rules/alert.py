"""The alert record: what one alert says (its series, step, value, summary), and the
transitions the life cycle makes of it. :mod:`sentinel.rules.lifecycle` decides the states."""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sentinel.rules.base import Verdict
from sentinel.rules.config import Rule
from sentinel.store import Labels

AlertKey = tuple[str, str, str]
"""``(alertname, job, run)``."""
SeriesKey = tuple[int, Labels]
"""``(rank, labels beyond job/run/rank)``."""


def compact_ranks(ranks: Sequence[int]) -> str:
    """``[3]`` → ``rank 3``; ``[0..7, 9]`` → ``ranks 0–7, 9``; ``[]`` → ``no rank``."""
    rs = sorted(set(ranks))
    if not rs:
        return "no rank"
    if len(rs) == 1:
        return f"rank {rs[0]}"
    parts, start, prev = [], rs[0], rs[0]
    for r in [*rs[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        if r is not None:
            start = prev = r
    return "ranks " + ", ".join(parts)


def compact_groups(groups: Sequence[str], limit: int = 3) -> str:
    """The first ``limit`` groups, then ``(+N more)``; ``-`` when there are none."""
    if not groups:
        return "-"
    head = ", ".join(groups[:limit])
    return head if len(groups) <= limit else f"{head} (+{len(groups) - limit} more)"


def compact_optimizers(optimizers: Sequence[str]) -> str:
    """``["1"]`` → `` (optimizer 1)``; ``["0", "1"]`` → `` (optimizers 0, 1)``; ``[]`` → ``""``:
    what follows the ranks in an alert of a process with several optimizer streams."""
    if not optimizers:
        return ""
    return f" (optimizer{'s' if len(optimizers) > 1 else ''} {', '.join(optimizers)})"


@dataclass(slots=True)
class _Series:
    rank: int
    group: str | None
    fails: int = 0
    oks: int = 0
    active: bool = False
    last: Verdict | None = None  # the latest failing verdict
    step: int = 0
    first_step: int = 0  # the step of the first failing verdict of the current streak
    first_value: float = math.nan  # ... and its value
    worst_value: float = math.nan  # the value furthest past the threshold in the streak
    worst_step: int = 0
    optimizer: str | None = None  # the stream's ``optimizer`` label, in a process with several

    def record(self, v: Verdict, step: int, first: bool) -> None:
        """Keep the first and the worst value of the streak (worse: further on the
        firing side of the threshold, up for a ceiling, down for a floor)."""
        if first:
            self.first_step, self.first_value = step, v.value
            self.worst_step, self.worst_value = step, v.value
        elif _worse(v.value, self.worst_value, v.value >= v.threshold):
            self.worst_step, self.worst_value = step, v.value


def _worse(a: float, b: float, up: bool) -> bool:
    if a != a:
        return False
    return b != b or (a > b if up else a < b)


@dataclass(frozen=True)
class Transition:
    """One change of an alert's state, to ``firing`` or to ``resolved``.

    ``notify`` is False for changes inside the rule's cooldown: store them, don't send.
    """

    alertname: str
    severity: str
    state_from: str
    state_to: str
    job: str
    run: str
    ranks: tuple[int, ...]
    groups: tuple[str, ...]
    step: int
    time: float
    value: float
    threshold: float
    summary: str
    causes: tuple[str, ...]
    checks: tuple[str, ...]
    runbook: str
    notify: bool = True
    started_step: int = 0
    started_at: float = 0.0
    optimizers: tuple[str, ...] = ()
    """The optimizer streams the alert's series belong to (empty: a process with one)."""
    ended: bool = False
    """A resolve because the ranks that held the alert ended (their run finished or they
    exited) while it fired: nothing recovered."""

    @property
    def fired_seconds(self) -> float:
        """How long the alert fired (for a resolve; 0 for a firing)."""
        return max(0.0, self.time - self.started_at) if self.state_to == "resolved" else 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (lists for tuples, None for NaN)."""
        return {
            "alertname": self.alertname,
            "severity": self.severity,
            "state_from": self.state_from,
            "state_to": self.state_to,
            "job": self.job,
            "run": self.run,
            "ranks": list(self.ranks),
            "groups": list(self.groups),
            "step": self.step,
            "time": self.time,
            "value": _num(self.value),
            "threshold": _num(self.threshold),
            "summary": self.summary,
            "causes": list(self.causes),
            "checks": list(self.checks),
            "runbook": self.runbook,
            "notify": self.notify,
            "started_step": self.started_step,
            "started_at": self.started_at,
            "optimizers": list(self.optimizers),
            "ended": self.ended,
        }


def _value_spec(template: str) -> str:
    """The format spec the summary gives ``{value}`` (``.4g`` when it gives none)."""
    try:
        for _, name, spec, _ in string.Formatter().parse(template):
            if name == "value" and spec:
                return spec
    except ValueError:
        pass
    return ".4g"


def _shows_value(template: str) -> bool:
    try:
        return any(name == "value" for _, name, _, _ in string.Formatter().parse(template))
    except ValueError:
        return False


def _num(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


@dataclass(eq=False)
class Alert:
    """The open (or recently resolved) alert of one rule in one run.

    ``ranks``, ``groups``, ``step``, ``value``, ``threshold`` describe the failing series
    (the latest failing verdict for the numbers); they are refreshed as verdicts arrive,
    so ``step`` is the latest failing step (``last_step``). The history stays put:
    ``started_step`` is the first failing step of the series that made the alert fire
    (the step the trouble began, not the step it fired at) and ``started_at`` the time it
    fired; both are set once, when it fires.
    """

    rule: Rule
    job: str
    run: str
    state: str = "pending"
    pending_since: float = 0.0
    started_at: float | None = None
    started_step: int | None = None
    resolved_at: float | None = None
    notify: bool = True
    ranks: tuple[int, ...] = ()
    groups: tuple[str, ...] = ()
    optimizers: tuple[str, ...] = ()
    step: int = 0
    value: float = math.nan
    threshold: float = math.nan
    baseline: float | None = None
    detail: str = ""
    started_value: float | None = None
    worst_value: float = math.nan
    worst_step: int = 0
    ended: bool = False  # resolved because what held it ended with its ranks, not recovered
    back: tuple[int, float] | None = None  # (step, value) of the latest passing verdict of a firing series
    series: dict[SeriesKey, _Series] = field(default_factory=dict)
    _active_since: float | None = None
    _seen_pending: bool = False
    _dirty: bool = True  # a series became active or stopped being so since the last _refresh
    _touched: _Series | None = None  # the series of the latest failing verdict

    @property
    def alertname(self) -> str:
        return self.rule.name

    @property
    def severity(self) -> str:
        return self.rule.severity

    @property
    def summary(self) -> str:
        """The rule's summary template rendered with the current fields. Once the alert
        fired, ``{step}`` is ``started_step`` and ``{value}`` the value at that step, so the
        text names where the trouble began with what it was then; when later verdicts
        differ, the worst and the latest value follow, each with its step."""
        ranks = compact_ranks(self.ranks) + compact_optimizers(self.optimizers)
        where = ranks
        if self.groups:
            where += f" ({compact_groups(self.groups)})"
        fields = {
            "alertname": self.rule.name,
            "severity": self.rule.severity,
            "job": self.job,
            "run": self.run,
            "step": self.step if self.started_step is None else self.started_step,
            "value": self.value if self.started_value is None else self.started_value,
            "threshold": self.threshold,
            "baseline": math.nan if self.baseline is None else self.baseline,
            "detail": self.detail,
            "ranks": ranks,
            "groups": compact_groups(self.groups),
            "where": where,
        }
        try:
            text = self.rule.summary.format(**fields)
        except (ValueError, TypeError, KeyError, IndexError):  # validated at load; belt and braces
            text = f"{self.rule.name} on {where}: {self.value:g} (threshold {self.threshold:g})"
        return text + self.history()

    def history(self) -> str:
        """``; worst W at step S, latest L at step T`` once the alert fired and later
        verdicts moved on from the first one (empty otherwise), and for a recovery
        ``back to B at step U`` (the value that resolved it: "latest" is the latest *failing*
        value, which read as still failing in a resolve). Only for a summary that shows
        ``{value}``: where it shows the verdict's ``{detail}`` instead (a count of samples,
        a fall since the start), that detail is the latest verdict's already, and a bare
        number after it would name nothing (``latest 10 at step 10``)."""
        if self.started_step is None or not _shows_value(self.rule.summary):
            return ""
        spec = _value_spec(self.rule.summary)

        def fmt(x: float) -> str:
            try:
                return format(x, spec)
            except (ValueError, TypeError):
                return f"{x:.4g}"
        back = ""
        if self.state == "resolved" and not self.ended and self.back is not None and self.back[1] == self.back[1]:
            back = f"back to {fmt(self.back[1])} at step {self.back[0]}"
        start = self.started_value
        if self.step == self.started_step or (self.value == start and self.worst_value in (start, self.value)):
            return "; " + back if back else ""  # nothing moved: the start says it all
        parts = []
        if (self.worst_value == self.worst_value and self.worst_step not in (self.started_step, self.step)
                and self.worst_value not in (start, self.value)):
            parts.append(f"worst {fmt(self.worst_value)} at step {self.worst_step}")
        parts.append(f"latest {fmt(self.value)} at step {self.step}")
        if back:
            parts.append(back)
        return "; " + ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The HTTP API's view: alertname, severity, state, job, run, ranks, groups, step,
        value, threshold, summary, started_step, started_at, last_step, last_value,
        resolved_at, ended (resolved because its ranks ended, not recovered), plus causes,
        checks, runbook. ``step``/``value`` are the latest failing
        verdict's (equal to ``last_step``/``last_value``); ``started_step`` and
        ``started_at`` are None while pending."""
        return {
            "alertname": self.rule.name,
            "severity": self.rule.severity,
            "state": self.state,
            "job": self.job,
            "run": self.run,
            "ranks": list(self.ranks),
            "groups": list(self.groups),
            "optimizers": list(self.optimizers),
            "step": self.step,
            "value": _num(self.value),
            "threshold": _num(self.threshold),
            "summary": self.summary,
            "started_step": self.started_step,
            "started_value": _num(self.started_value),
            "started_at": self.started_at,
            "worst_step": self.worst_step if self.started_step is not None else None,
            "worst_value": _num(self.worst_value) if self.started_step is not None else None,
            "last_step": self.step,
            "last_value": _num(self.value),
            "resolved_at": self.resolved_at,
            "ended": self.ended,
            "causes": list(self.rule.causes),
            "checks": list(self.rule.checks),
            "runbook": self.rule.runbook,
        }

    def _follow(self) -> None:
        """Take the numbers of the latest failing verdict, when nothing else changed (a
        full :meth:`_refresh` walks every series: hundreds for a per-group rule on 8 ranks)."""
        s = self._touched
        if s is not None and s.active and s.last is not None and s.step >= self.step:
            self.step, self.value, self.threshold, self.baseline = s.step, s.last.value, s.last.threshold, s.last.baseline
            self._worst(s)

    def _worst(self, s: _Series) -> None:
        if s.last is not None and _worse(s.worst_value, self.worst_value, s.last.value >= s.last.threshold):
            self.worst_value, self.worst_step = s.worst_value, s.worst_step

    def _refresh(self, series: Sequence[_Series]) -> None:
        self._dirty = False
        ranks: set[int] = set()
        optimizers: set[str] = set()
        groups: dict[str, None] = {}
        details: dict[str, list[int]] = {}  # each distinct detail, and the ranks it is of
        latest: _Series | None = None
        for s in sorted(series, key=lambda s: s.rank):
            if s.rank >= 0:  # node-level series (GPUs) have no rank
                ranks.add(s.rank)
            if s.optimizer is not None:
                optimizers.add(s.optimizer)
            if s.group is not None:
                groups[s.group] = None
            if s.last is not None:
                groups.update(dict.fromkeys(s.last.groups))
                if s.last.detail:
                    details.setdefault(s.last.detail, []).append(s.rank)
                if latest is None or s.step > latest.step:
                    latest = s
                self._worst(s)
        self.ranks = tuple(sorted(ranks))
        self.optimizers = tuple(sorted(optimizers, key=lambda o: (len(o), o)))
        self.groups = tuple(groups)
        # ranks that differ say which is which: the one rank of eight that waits elsewhere
        self.detail = ", ".join(details) if len(details) < 2 or len(self.ranks) < 2 else ", ".join(
            f"{d} ({compact_ranks(sorted(set(r for r in ranks if r >= 0)))})" for d, ranks in details.items())
        if latest is not None and latest.last is not None:
            v = latest.last
            self.step, self.value, self.threshold = latest.step, v.value, v.threshold
            self.baseline = v.baseline
