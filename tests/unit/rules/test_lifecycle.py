"""The alert life cycle: pending → firing → resolved, hysteresis, grouping, cooldown."""

from __future__ import annotations

from typing import Any

import pytest

from sentinel.rules import Lifecycle, Rule, Verdict, compact_ranks
from sentinel.rules.config import parse_rule
from sentinel.rules.lifecycle import compact_groups

FAIL = Verdict(True, 2000.0, 1000.0)
OK = Verdict(False, 1.0, 1000.0)


def rule(**kw: Any) -> Rule:
    raw = {
        "name": "GradientExplosion",
        "kind": "threshold",
        "metric": "sentinel_grad_norm",
        "severity": "warning",
        "params": {"op": ">", "value": 1000.0},
        "summary": "norm {value:g} > {threshold:g} on {ranks} ({groups}) at step {step}",
        "causes": ["init"],
        "checks": ["check per-layer norms"],
        "runbook": "look",
        "group_wait_seconds": 0.0,
        **kw,
    }
    r, problems = parse_rule(raw, ("test",))
    assert r is not None, problems
    return r


def feed(
    life: Lifecycle, r: Rule, verdicts: list[Verdict | None], rank: int = 0, t0: float = 0.0
) -> list[str]:
    """Feed one verdict per step for rank ``rank``; return the state after each."""
    states = []
    for i, v in enumerate(verdicts):
        life.observe(r, "job", "run", rank, (), v, i, t0 + i)
        life.settle(r.name, "job", "run", t0 + i, [rank])
        open_ = [a for a in life.active() if a.rule.name == r.name]
        states.append(open_[0].state if open_ else "inactive")
    return states


@pytest.mark.parametrize(
    ("for_steps", "resolve_after", "verdicts", "states"),
    [
        (1, 1, [FAIL, OK], ["firing", "inactive"]),
        (0, 1, [FAIL], ["firing"]),
        (3, 1, [FAIL, FAIL, FAIL, OK], ["pending", "pending", "firing", "inactive"]),
        # a failing run shorter than for_steps never fires
        (3, 1, [FAIL, FAIL, OK, FAIL, FAIL, OK], ["pending", "pending", "inactive"] * 2),
        # hysteresis: one OK evaluation does not resolve when resolve_after is 3
        (1, 3, [FAIL, OK, OK, FAIL, OK, OK, OK], ["firing"] * 6 + ["inactive"]),
        # None (no data / warm-up) changes nothing
        (
            2, 2, [FAIL, None, FAIL, None, OK, None, OK],
            ["pending"] * 2 + ["firing"] * 4 + ["inactive"],
        ),  # fmt: skip
    ],
)
def test_states(
    for_steps: int, resolve_after: int, verdicts: list[Verdict | None], states: list[str]
) -> None:
    life = Lifecycle()
    assert feed(life, rule(for_steps=for_steps, resolve_after=resolve_after), verdicts) == states


def test_transitions_fire_then_resolve_and_resolved_is_kept() -> None:
    life, r = Lifecycle(), rule(for_steps=2)
    out = []
    for i, v in enumerate([FAIL, FAIL, FAIL, OK]):
        life.observe(r, "job", "run", 0, (), v, 100 + i, 10.0 + i)
        out += life.settle(r.name, "job", "run", 10.0 + i, [0])
    assert [(t.state_from, t.state_to) for t in out] == [
        ("pending", "firing"),
        ("firing", "resolved"),
    ]
    fired, resolved = out
    assert fired.step == 101 and fired.time == 11.0 and fired.ranks == (0,)
    # the summary names the step the trouble began (the first of the for_steps failures)
    assert fired.started_step == 100 and fired.started_at == 11.0
    assert fired.summary == "norm 2000 > 1000 on rank 0 (-) at step 100"
    assert resolved.started_step == 100 and resolved.fired_seconds == 2.0
    assert fired.causes == ("init",) and fired.checks == ("check per-layer norms",)
    assert fired.runbook == "look"
    assert fired.notify and resolved.notify
    assert life.active() == []
    [alert] = life.recent()
    j = alert.to_json()
    assert j["state"] == "resolved" and j["started_at"] == 11.0 and j["resolved_at"] == 13.0
    assert {"alertname", "severity", "state", "run", "ranks", "groups", "step", "value",
            "threshold", "summary", "started_at", "resolved_at"} <= set(j)  # fmt: skip
    assert fired.to_json()["state_to"] == "firing"


def test_history_stays_while_the_latest_values_move() -> None:
    """started_step/started_at are where the alert began; last_step/last_value follow."""
    life, r = Lifecycle(), rule()
    for i in range(500):
        v = Verdict(True, 2000.0 + i, 1000.0) if i >= 200 else OK
        life.observe(r, "job", "run", 0, (), v, i, float(i))
        life.settle(r.name, "job", "run", float(i), [0])
    [a] = life.active()
    j = a.to_json()
    assert j["state"] == "firing" and j["started_step"] == 200 and j["started_at"] == 200.0
    assert j["last_step"] == 499 and j["last_value"] == 2499.0 and j["step"] == 499
    assert "at step 200" in j["summary"]


def test_a_summary_that_shows_its_detail_gets_no_bare_latest_value() -> None:
    """An early rule counts samples above its threshold: its detail says the latest count,
    and a suffix ``latest 10 at step 10`` would name nothing. A summary with ``{value}``
    keeps its ``latest`` (and ``worst``)."""
    shown, counted = rule(), rule(summary="Updates too large on {ranks}: {detail}")
    for r in (shown, counted):
        life = Lifecycle()
        for i in range(1, 11):
            life.observe(r, "job", "run", 0, (), Verdict(True, float(i + 2), 3.0, detail=f"{i + 2} samples above"),
                         i, float(i))
            life.settle(r.name, "job", "run", float(i), [0])
        [a] = life.active()
        summary = a.to_json()["summary"]
        if r is shown:
            assert summary.endswith("; latest 12 at step 10"), summary
        else:
            assert summary == "Updates too large on rank 0: 12 samples above", summary


def test_immediate_fire_reports_from_inactive() -> None:
    life, r = Lifecycle(), rule()
    life.observe(r, "job", "run", 0, (), FAIL, 1, 1.0)
    [t] = life.settle(r.name, "job", "run", 1.0, [0])
    assert (t.state_from, t.state_to) == ("inactive", "firing")


def test_ranks_0_to_7_group_into_one_alert() -> None:
    life, r = Lifecycle(), rule(group_wait_seconds=5.0)
    everyone = list(range(8))
    out = []
    for rank in everyone:  # frames of one step arrive rank by rank
        life.observe(r, "job", "run", rank, (), FAIL, 42, 100.0)
        out += life.settle(r.name, "job", "run", 100.0, everyone)
    assert len(out) == 1
    [t] = out
    assert t.ranks == tuple(everyone)
    assert "on ranks 0–7 " in t.summary
    assert len(life.active()) == 1


def test_group_wait_then_fire_with_the_ranks_that_joined() -> None:
    life, r = Lifecycle(), rule(group_wait_seconds=5.0)
    everyone = list(range(8))
    life.observe(r, "job", "run", 3, (), FAIL, 42, 100.0)
    assert life.settle(r.name, "job", "run", 100.0, everyone) == []
    assert life.active()[0].state == "pending"
    life.observe(r, "job", "run", 5, (), FAIL, 42, 101.0)
    assert life.settle(r.name, "job", "run", 101.0, everyone) == []
    assert life.flush(104.0) == []
    [t] = life.flush(105.0)
    assert t.ranks == (3, 5) and "ranks 3, 5" in t.summary


def test_event_that_recovers_within_the_group_wait_is_still_reported() -> None:
    life, r = Lifecycle(), rule(group_wait_seconds=5.0)
    life.observe(r, "job", "run", 3, (), FAIL, 42, 100.0)
    assert life.settle(r.name, "job", "run", 100.0, [0, 1, 2, 3]) == []
    life.observe(r, "job", "run", 3, (), OK, 43, 100.1)
    out = life.settle(r.name, "job", "run", 100.1, [0, 1, 2, 3])
    assert [(t.state_to, t.ranks, t.step) for t in out] == [
        ("firing", (3,), 42),
        ("resolved", (3,), 42),
    ]
    assert life.active() == []


def test_retiring_a_pending_rank_reports_nothing() -> None:
    life, r = Lifecycle(), rule(group_wait_seconds=5.0)
    life.observe(r, "job", "run", 3, (), FAIL, 42, 100.0)
    life.settle(r.name, "job", "run", 100.0, [0, 3])
    assert life.drop("job", "run", 3, 101.0) == [] and life.active() == []


def test_groups_are_listed_per_series() -> None:
    life, r = Lifecycle(), rule(per="group")
    for rank in (0, 1):
        for g in ("layers.3", "layers.4"):
            life.observe(r, "job", "run", rank, (("group", g),), FAIL, 7, 1.0)
    [t] = life.settle(r.name, "job", "run", 1.0, [0, 1])
    assert t.ranks == (0, 1) and t.groups == ("layers.3", "layers.4")
    # one group recovers on both ranks: it leaves the alert, which stays firing
    for rank in (0, 1):
        life.observe(r, "job", "run", rank, (("group", "layers.3"),), OK, 8, 2.0)
    assert life.settle(r.name, "job", "run", 2.0, [0, 1]) == []
    assert life.active()[0].groups == ("layers.4",)


def test_a_large_alert_follows_its_firing_series_only() -> None:
    """Past 16 series an alert takes its ranks and groups again only when a series starts
    or stops firing; a series that failed once and recovered never fired, so it is not
    listed, while one that stopped firing leaves, and so does a rank that was retired."""
    life, r = Lifecycle(), rule(per="group", for_steps=2)
    groups = [f"layers.{i}" for i in range(20)]
    for step in (1, 2):
        for rank in (0, 1):
            for g in groups:
                life.observe(r, "job", "run", rank, (("group", g),), FAIL, step, float(step))
        life.settle(r.name, "job", "run", float(step), [0, 1])
    [a] = life.active()
    assert a.state == "firing" and a.ranks == (0, 1) and a.groups == tuple(groups)
    # a new group fails once (pending, for_steps 2) then recovers: never listed
    life.observe(r, "job", "run", 0, (("group", "head"),), FAIL, 3, 3.0)
    life.settle(r.name, "job", "run", 3.0, [0, 1])
    life.observe(r, "job", "run", 0, (("group", "head"),), OK, 4, 4.0)
    life.settle(r.name, "job", "run", 4.0, [0, 1])
    assert "head" not in a.groups
    # layers.0 recovers on both ranks: it leaves
    for rank in (0, 1):
        life.observe(r, "job", "run", rank, (("group", "layers.0"),), OK, 5, 5.0)
    life.settle(r.name, "job", "run", 5.0, [0, 1])
    assert a.groups == tuple(groups[1:])
    # rank 0 is retired: only rank 1 holds the alert
    assert life.drop("job", "run", 0, 6.0) == []
    assert a.ranks == (1,) and a.state == "firing"


def test_open_in_is_a_live_view_of_a_runs_open_alerts() -> None:
    """The rule engine reads a run's open alerts once per frame and relies on the view
    following alerts that open and close meanwhile; a dropped run leaves nothing behind."""
    life, r = Lifecycle(), rule()
    opened = life.open_in("job", "run")
    assert dict(opened) == {}
    life.observe(r, "job", "run", 0, (), FAIL, 1, 1.0)
    assert set(opened) == {r.name}
    life.settle(r.name, "job", "run", 1.0, [0])
    life.observe(r, "job", "run", 0, (), OK, 2, 2.0)
    life.settle(r.name, "job", "run", 2.0, [0])
    assert dict(opened) == {} and life.open_in("job", "other") == {}
    life.observe(r, "job", "run", 0, (), FAIL, 3, 3.0)
    life.drop("job", "run", None, 4.0)
    assert ("job", "run") not in life._by_run and ("job", "other") in life._by_run


def test_detector_named_groups_are_listed_in_order() -> None:
    life, r = Lifecycle(), rule()
    v = Verdict(True, 1.0, 0.0, detail="grad", groups=("layers.9", "layers.2"))
    life.observe(r, "job", "run", 0, (("source", "grad"),), v, 1, 1.0)
    [t] = life.settle(r.name, "job", "run", 1.0, [0])
    assert t.groups == ("layers.9", "layers.2")


def test_cooldown_suppresses_refire_notification() -> None:
    life, r = Lifecycle(), rule(cooldown_seconds=60.0)

    def step(v: Verdict, t: float) -> list[tuple[str, bool]]:
        life.observe(r, "job", "run", 0, (), v, int(t), t)
        return [(x.state_to, x.notify) for x in life.settle(r.name, "job", "run", t, [0])]

    assert step(FAIL, 0.0) == [("firing", True)]
    assert step(OK, 1.0) == [("resolved", True)]
    assert step(FAIL, 30.0) == [("firing", False)]  # inside the cooldown: recorded, not sent
    assert step(OK, 31.0) == [("resolved", False)]
    assert step(FAIL, 200.0) == [("firing", True)]
    assert [a.state for a in life.recent()] == ["resolved", "resolved"]


def test_recent_is_bounded_and_newest_first() -> None:
    life, r = Lifecycle(recent_limit=3), rule()
    for i in range(5):
        life.observe(r, "job", f"run{i}", 0, (), FAIL, 1, float(i))
        life.settle(r.name, "job", f"run{i}", float(i), [0])
        life.observe(r, "job", f"run{i}", 0, (), OK, 2, float(i))
        life.settle(r.name, "job", f"run{i}", float(i), [0])
    assert [a.run for a in life.recent()] == ["run4", "run3", "run2"]


def test_runs_are_separate_alerts() -> None:
    life, r = Lifecycle(), rule()
    for run in ("a", "b"):
        life.observe(r, "job", run, 0, (), FAIL, 1, 1.0)
        life.settle(r.name, "job", run, 1.0, [0])
    assert sorted(a.run for a in life.active()) == ["a", "b"]


def test_drop_resolves_alerts_of_a_retired_rank() -> None:
    life, r = Lifecycle(), rule()
    for rank in (0, 1):
        life.observe(r, "job", "run", rank, (), FAIL, 1, 1.0)
    life.settle(r.name, "job", "run", 1.0, [0, 1])
    assert life.drop("job", "run", 0, 2.0) == []
    assert life.active()[0].ranks == (1,)
    [t] = life.drop("job", "run", None, 3.0)
    assert t.state_to == "resolved"


@pytest.mark.parametrize(("last", "ended"), [(FAIL, True), (OK, False)], ids=["firing-at-the-end", "recovered"])
def test_a_resolve_says_whether_the_values_recovered_or_the_ranks_ended(last: Verdict, ended: bool) -> None:
    """An alert still firing when its run ends is closed as ended, not reported as a recovery;
    one that recovered before the end says so as before."""
    life, r = Lifecycle(), rule()
    out = []
    for step, v in enumerate([FAIL, FAIL, last], 1):
        life.observe(r, "job", "run", 0, (), v, step, float(step))
        out += life.settle(r.name, "job", "run", float(step), [0])
    out += life.drop("job", "run", None, 10.0)
    assert [(t.state_to, t.ended) for t in out] == [("firing", False), ("resolved", ended)]
    assert life.recent()[0].to_json()["ended"] is ended


def test_firing_series() -> None:
    life, r = Lifecycle(), rule()
    life.observe(r, "job", "run", 0, (), FAIL, 1, 1.0)
    life.settle(r.name, "job", "run", 1.0, [0])
    labels = {"alertname": "GradientExplosion", "severity": "warning", "job": "job", "run": "run"}
    assert life.firing_series() == [(labels, 1.0)]
    life.observe(r, "job", "run", 0, (), OK, 2, 2.0)
    life.settle(r.name, "job", "run", 2.0, [0])
    assert life.firing_series() == [(labels, 0.0)]


def test_pending_series_survive_a_resolve() -> None:
    # rank 0 fires; rank 1 is still counting towards for_steps when rank 0 recovers
    life, r = Lifecycle(), rule(for_steps=2)
    for v0, v1, i in [(FAIL, OK, 0), (FAIL, OK, 1), (OK, FAIL, 2)]:
        life.observe(r, "job", "run", 0, (), v0, i, float(i))
        life.observe(r, "job", "run", 1, (), v1, i, float(i))
        life.settle(r.name, "job", "run", float(i), [0, 1])
    life.observe(r, "job", "run", 1, (), FAIL, 3, 3.0)
    [t] = life.settle(r.name, "job", "run", 3.0, [0, 1])
    assert t.state_to == "firing" and t.ranks == (1,)


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([], "no rank"),
        ([3], "rank 3"),
        ([0, 1, 2, 3, 4, 5, 6, 7], "ranks 0–7"),
        ([7, 0, 1, 2, 3, 5], "ranks 0–3, 5, 7"),
        ([1, 2, 9, 10, 11], "ranks 1–2, 9–11"),
    ],
)
def test_compact_ranks(ranks: list[int], text: str) -> None:
    assert compact_ranks(ranks) == text


def test_compact_groups() -> None:
    assert compact_groups([]) == "-"
    assert compact_groups(["a", "b"]) == "a, b"
    assert compact_groups(["a", "b", "c", "d", "e"]) == "a, b, c (+2 more)"
