"""The one place alert states live: pending, firing, resolved, grouping and cooldowns.

Each (rule, job, run) has at most one open :class:`Alert`. It gathers every *series*
(one per rank and extra label set, e.g. a group) that the rule currently fails on:

- a series fails after ``for_steps`` consecutive failing verdicts (0 or 1: the first) and
  recovers after ``resolve_after`` consecutive OK verdicts (hysteresis); a verdict of
  None (no data, warm-up) changes nothing;
- the alert is *pending* while some series fails but none has failed long enough, or
  while it waits up to ``group_wait_seconds`` for the other ranks to join — it fires at
  once when every known rank fails — so eight ranks going NaN together give one message
  that says "ranks 0–7". A series that held and recovered within the wait is still
  reported (fired and resolved at once);
- it is *firing* from then until no series fails, then *resolved* and kept, bounded, in
  :meth:`Lifecycle.recent`;
- a re-fire within ``cooldown_seconds`` of the last resolve is recorded with
  ``notify=False``, and so is its resolve.

Only changes to *firing* and to *resolved* produce :class:`Transition` records; pending is
visible through :meth:`Lifecycle.active`. Not thread-safe: the rule engine serialises.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping

from sentinel.rules.alert import Alert, AlertKey, SeriesKey, Transition, _Series, compact_groups, compact_ranks
from sentinel.rules.base import Verdict
from sentinel.rules.config import Rule
from sentinel.store import Labels

__all__ = ["Alert", "AlertKey", "Lifecycle", "SeriesKey", "Transition", "compact_groups", "compact_ranks"]

class Lifecycle:
    """Alert states for all rules and runs.

    Args:
        recent_limit: resolved alerts kept for :meth:`recent`.
    """

    def __init__(self, recent_limit: int = 200) -> None:
        self._open: dict[AlertKey, Alert] = {}
        # the same alerts by run, then rule name: what the evaluator reads on every frame
        self._by_run: dict[tuple[str, str], dict[str, Alert]] = {}
        self._recent: deque[Alert] = deque(maxlen=recent_limit)
        self._resolved_at: dict[AlertKey, float] = {}

    def observe(
        self,
        rule: Rule,
        job: str,
        run: str,
        rank: int,
        extra: Labels,
        verdict: Verdict | None,
        step: int,
        now: float,
        for_steps: int | None = None,
    ) -> None:
        """Record one verdict for one series; call :meth:`settle` after a frame's verdicts.

        Args:
            extra: the series' labels beyond job/run/rank; a ``group`` among them is
                listed in the alert's groups.
            verdict: None leaves the series as it was.
            for_steps: overrides the rule's ``for_steps`` for this verdict (right after
                a learning-rate change, see ``Rule.lr_for_steps``).
        """
        if verdict is None:
            return
        key = (rule.name, job, run)
        alert = self._open.get(key)
        if alert is None:
            if not verdict.firing:
                return
            alert = self._put(key, Alert(rule, job, run, pending_since=now))
        skey = (rank, extra)
        s = alert.series.get(skey)
        if verdict.firing:
            if s is None:
                group = next((v for k, v in extra if k == "group"), None)
                opt = next((v for k, v in extra if k == "optimizer"), None)
                s = alert.series[skey] = _Series(rank, group, optimizer=opt)  # not active yet: no refresh
            s.record(verdict, step, s.fails == 0)
            s.fails += 1
            s.oks = 0
            s.last = verdict
            s.step = step
            alert._touched = s
            if not s.active and s.fails >= max(1, rule.for_steps if for_steps is None else for_steps):
                s.active = alert._dirty = True
        elif s is not None:
            s.fails = 0
            s.oks += 1
            if s.active:
                alert.back = (step, verdict.value)
            if s.active and s.oks >= rule.resolve_after:
                s.active = False
                alert._dirty = True  # the firing set changed
            if not s.active:
                del alert.series[skey]

    def tracks(self, name: str, job: str, run: str, rank: int) -> bool:
        """Whether an open alert of rule ``name`` holds a series of ``rank``."""
        alert = self._open.get((name, job, run))
        return alert is not None and any(k[0] == rank for k in alert.series)

    def open_series(self, name: str, job: str, run: str) -> Mapping[tuple[int, Labels], object] | None:
        """The series (keyed ``(rank, extra labels)``) held by the open alert of rule
        ``name`` in the run, or None when none is open."""
        alert = self._open.get((name, job, run))
        return None if alert is None else alert.series

    def open_in(self, job: str, run: str) -> Mapping[str, Alert]:
        """The open alerts of a run by rule name: a live view, which alerts opened or
        closed later join or leave (until the run is dropped)."""
        return self._of_run(job, run)

    def _of_run(self, job: str, run: str) -> dict[str, Alert]:
        opened = self._by_run.get((job, run))
        if opened is None:
            opened = self._by_run[(job, run)] = {}
        return opened

    def _put(self, key: AlertKey, alert: Alert) -> Alert:
        self._open[key] = alert
        self._of_run(key[1], key[2])[key[0]] = alert
        return alert

    def _remove(self, key: AlertKey) -> None:
        del self._open[key]
        self._by_run[(key[1], key[2])].pop(key[0], None)

    def is_open(self, name: str, job: str, run: str) -> bool:
        """Whether rule ``name`` has a pending or firing alert in the run."""
        return (name, job, run) in self._open

    def settle(
        self, name: str, job: str, run: str, now: float, ranks_known: Collection[int] = ()
    ) -> list[Transition]:
        """Move the alert of (rule, job, run) to the state its series call for.

        Args:
            ranks_known: every rank seen in the run; when all of them fail, a pending
                alert fires without waiting for ``group_wait_seconds``.

        Returns:
            The transitions made: none, one, or a firing and its resolve when the
            condition held and cleared while waiting for other ranks.
        """
        key = (name, job, run)
        a = self._open.get(key)
        if a is None:
            return []
        active = [s for s in a.series.values() if s.active]
        if a.state == "firing":
            if not active:
                return [self._resolve(key, a, now)]
            if a._dirty or len(active) <= 16:  # small alerts: details of every series stay fresh
                a._refresh(active)
            else:
                a._follow()
            return []
        if not active:
            if a._active_since is not None:
                # held for for_steps but recovered while waiting for other ranks: it
                # happened, so report it, and its end
                fired = self._fire(key, a, now)
                return [fired, self._resolve(key, a, now)]
            if not a.series:
                self._remove(key)  # never held for for_steps: quietly back to inactive
                return []
            a._refresh(list(a.series.values()))
            a._seen_pending = True
            return []
        if a._active_since is None:
            a._active_since = now
        a._refresh(active)
        wait = a.rule.group_wait_seconds
        everyone = bool(ranks_known) and set(a.ranks) >= set(ranks_known)
        if wait > 0 and now - a._active_since < wait and not everyone:
            a._seen_pending = True
            return []
        return [self._fire(key, a, now)]

    def flush(self, now: float) -> list[Transition]:
        """Fire pending alerts whose group wait has passed; call periodically."""
        out = []
        for key, a in list(self._open.items()):
            since = a._active_since
            waited = since is not None and now - since >= a.rule.group_wait_seconds
            if a.state == "pending" and waited:
                out += self.settle(*key, now=now)
        return out

    def drop(self, job: str, run: str, rank: int | None, now: float,
             keep: Collection[str] = ()) -> list[Transition]:
        """Forget the series of one rank (or of every rank) of a run; resolve what empties.

        For a rank or run that ended: its alerts must not stay open forever. Alerts of
        the rules in ``keep`` stay as they are (a crash stays reported after the rank is
        gone).
        """
        out = []
        for key, a in list(self._open.items()):
            if key[1] != job or key[2] != run or key[0] in keep:
                continue
            leaving = [k for k in a.series if rank is None or k[0] == rank]
            held = any(a.series[k].active for k in leaving)
            for skey in leaving:
                del a.series[skey]
                a._dirty = True
            left = any(s.active for s in a.series.values())
            if a.state == "pending" and not left:
                a._active_since = None  # the ranks that held it are gone: nothing to report
            a.ended = held and not left  # a resolve now is the ranks' end, not a recovery
            out += self.settle(*key, now=now)
        if rank is None and not self._by_run.get((job, run)):
            self._by_run.pop((job, run), None)
        return out

    def active(self) -> list[Alert]:
        """Open alerts, pending and firing, firing first."""
        return sorted(self._open.values(), key=lambda a: (a.state != "firing", a.pending_since))

    def recent(self) -> list[Alert]:
        """Resolved alerts, newest first (bounded)."""
        return list(self._recent)

    def firing_series(self) -> list[tuple[dict[str, str], float]]:
        """``(labels, value)`` for a ``sentinel_alert_firing`` gauge.

        1.0 for each firing alert; 0.0 for recently resolved ones that are not firing
        again, so the series drops to 0 rather than vanishing.
        """
        out: dict[AlertKey, tuple[dict[str, str], float]] = {}
        for a in [*self._recent, *self._open.values()]:
            if a.state == "pending":
                continue
            labels = {
                "alertname": a.rule.name, "severity": a.rule.severity, "job": a.job, "run": a.run
            }  # fmt: skip
            key = (a.rule.name, a.job, a.run)
            out[key] = (labels, 1.0 if a.state == "firing" else 0.0)
        return list(out.values())

    def _transition(self, a: Alert, state_from: str, now: float) -> Transition:
        r = a.rule
        return Transition(
            r.name, r.severity, state_from, a.state, a.job, a.run, a.ranks, a.groups, a.step,
            now, a.value, a.threshold, a.summary, tuple(r.causes), tuple(r.checks), r.runbook,
            a.notify, a.started_step if a.started_step is not None else a.step,
            a.started_at if a.started_at is not None else now, a.optimizers, a.ended,
        )  # fmt: skip

    def _fire(self, key: AlertKey, a: Alert, now: float) -> Transition:
        last = self._resolved_at.get(key)
        a.notify = not (last is not None and now - last < a.rule.cooldown_seconds)
        a.state = "firing"
        a.started_at = now
        held = [s.first_step for s in a.series.values() if s.active] or [s.first_step for s in a.series.values()]
        a.started_step = min(held) if held else a.step
        pool = [s for s in a.series.values() if s.active] or list(a.series.values())
        first = min(pool, key=lambda s: s.first_step, default=None)
        a.started_value = first.first_value if first is not None else a.value
        return self._transition(a, "pending" if a._seen_pending else "inactive", now)

    def _resolve(self, key: AlertKey, a: Alert, now: float) -> Transition:
        a.state = "resolved"
        a.resolved_at = now
        self._remove(key)
        if a.series:  # series still counting towards for_steps carry over to a new alert
            b = self._put(key, Alert(a.rule, a.job, a.run, pending_since=now, series=a.series))
            b._refresh(list(b.series.values()))
            a.series = {}
        self._recent.appendleft(a)
        self._resolved_at[key] = now
        if len(self._resolved_at) > 4096:  # bounded: forget the oldest cooldowns
            for k in sorted(self._resolved_at, key=self._resolved_at.__getitem__)[:1024]:
                del self._resolved_at[k]
        return self._transition(a, "firing", now)
