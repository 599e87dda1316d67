"""``/api/v1/status``: what the status page polls, and that it stays small at 64 ranks × 64 groups."""

from __future__ import annotations

import json
import math

from sentinel.serve.snapshot import MAX_CHART_RANKS, POINTS, status_json
from sentinel.store import Store, labels_of


class _Engine:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.finished: set[tuple[str, str, int]] = set()
        self.exited_ranks: dict[tuple[str, str, int], int] = {}
        self.alerts: list[dict[str, object]] = []

    def alerts_json(self) -> list[dict[str, object]]:
        return self.alerts


def _fill(store: Store, ranks: int, groups: int, steps: int, t0: float = 1000.0, run: str = "r") -> None:
    names = [f"layers.{g}" for g in range(groups)]
    for r in range(ranks):
        base = labels_of(job="j", run=run, rank=r)
        glabels = tuple(tuple(sorted(base + (("group", n),))) for n in names)
        for s in range(1, steps + 1):
            t = t0 + s * 0.1
            for name, v in (("sentinel_loss", 1.0 / s), ("sentinel_grad_norm", 2.0), ("sentinel_step", s),
                            ("sentinel_step_duration_seconds", 0.1), ("sentinel_last_step_timestamp_seconds", t),
                            ("sentinel_update_ratio", 1e-3), ("sentinel_memory_used_bytes", 1e9)):
                store.add(name, base, s, t, v)
            store.add_row("sentinel_group_grad_norm", glabels, [float(g + 1) for g in range(groups)], s, t)
        store.add("sentinel_learning_rate", tuple(sorted(base + (("param_group", "0"),))), 1, t0, 1e-3)


def test_states_values_and_charts() -> None:
    store = Store()
    _fill(store, 3, 4, 20)
    engine = _Engine(store)
    engine.finished.add(("j", "r", 1))
    engine.exited_ranks[("j", "r", 2)] = 137
    doc = status_json(engine, now=1002.5)
    [run] = doc["runs"]
    assert [(r["rank"], r["state"]) for r in run["ranks"]] == [(0, "training"), (1, "ended"), (2, "crashed")]
    assert run["state"] == "crashed" and run["ranks"][0]["values"]["loss"] == 1.0 / 20
    loss = doc["charts"]["loss"]["ranks"]["0"]
    assert loss[0] == [1, 1.0] and loss[-1][0] == 20
    assert doc["charts"]["learning_rate"]["ranks"]["0"][-1] == [20, 1e-3]  # held until the current step
    assert [g["group"] for g in doc["groups"]["largest"][:2]] == ["layers.3", "layers.2"]


def test_a_rank_without_steps_for_long_is_stalled() -> None:
    store = Store()
    _fill(store, 1, 1, 20)
    assert status_json(_Engine(store), now=1002.0 + 31)["runs"][0]["ranks"][0]["state"] == "stalled"


def test_a_rank_whose_heartbeats_go_on_without_steps_is_evaluating_until_they_stop() -> None:
    store = Store()
    _fill(store, 1, 1, 20)  # the last step at 1002.0
    base = labels_of(job="j", run="r", rank=0)
    store.add("sentinel_last_heartbeat_timestamp_seconds", base, 20, 1050.0, 1050.0)
    doc = status_json(_Engine(store), now=1060.0)
    [rank] = doc["runs"][0]["ranks"]
    assert (rank["state"], doc["runs"][0]["state"]) == ("evaluating", "evaluating")
    assert rank["seconds_since_step"] == 58.0 and "last_heartbeat" not in rank["values"]
    assert status_json(_Engine(store), now=1050.0 + 31)["runs"][0]["ranks"][0]["state"] == "stalled"


def test_the_ranks_that_wait_while_rank_0_evaluates_alone_are_evaluating_too() -> None:
    store = Store()
    _fill(store, 3, 1, 20)
    store.add("sentinel_last_heartbeat_timestamp_seconds", labels_of(job="j", run="r", rank=0), 20, 1050.0, 1050.0)
    [run] = status_json(_Engine(store), now=1060.0)["runs"]
    assert [r["state"] for r in run["ranks"]] == ["evaluating"] * 3 and run["state"] == "evaluating"


def test_nonfinite_groups_are_flagged_and_json_stays_valid() -> None:
    store = Store()
    _fill(store, 1, 3, 5)
    base = labels_of(job="j", run="r", rank=0)
    glabels = tuple(tuple(sorted(base + (("group", f"layers.{g}"),))) for g in range(3))
    store.add_row("sentinel_group_grad_norm", glabels, [1.0, math.nan, math.inf], 6, 1000.6)
    store.add("sentinel_loss", base, 6, 1000.6, math.nan)
    doc = status_json(_Engine(store), now=1001.0)
    assert [g["group"] for g in doc["groups"]["nonfinite"]] == ["layers.1", "layers.2"]
    assert doc["charts"]["loss"]["ranks"]["0"][-1] == [6, None]
    json.dumps(doc, allow_nan=False)  # what the server sends: NaN would be invalid JSON


def test_bounded_at_64_ranks_by_64_groups() -> None:
    store = Store()
    _fill(store, 64, 64, 600)
    doc = status_json(_Engine(store), now=1060.0)
    body = json.dumps(doc, allow_nan=False)
    assert len(doc["runs"][0]["ranks"]) == 64
    assert len(doc["charts"]["loss"]["ranks"]) == MAX_CHART_RANKS
    assert all(len(line) <= POINTS for c in doc["charts"].values() for line in c["ranks"].values())
    assert doc["groups"]["count"] == 64 and len(doc["groups"]["largest"]) == 8
    assert len(body) < 150_000, len(body)  # vs 1.4 MB for the same engine's /metrics


def test_run_selection() -> None:
    store = Store()
    _fill(store, 1, 1, 5, run="old")
    _fill(store, 1, 1, 5, t0=2000.0, run="new")
    engine = _Engine(store)
    assert status_json(engine, now=2001.0)["selected"] == "j/new"
    assert status_json(engine, {"run": "j/old"}, now=2001.0)["selected"] == "j/old"
    assert len(status_json(engine, {"points": "3"}, now=2001.0)["charts"]["loss"]["ranks"]["0"]) == 3


def test_an_optimizer_done_while_another_of_its_process_trains_is_idle_not_stalled() -> None:
    """Forward-Forward: one Adam per layer, trained in turn; the first layer's stream is
    silent while the second's steps. A stream of another process (a Hogwild worker, also
    rank 0) that stopped is stalled."""
    store = Store()
    for opt, t0 in (("0", 1000.0), ("1", 1100.0)):  # "0" stepped until 1002.0, "1" until 1102.0
        base = labels_of(job="j", run="r", rank=0, optimizer=opt)
        for s in range(1, 21):
            for name, v in (("sentinel_step", s), ("sentinel_step_duration_seconds", 0.1),
                            ("sentinel_last_step_timestamp_seconds", t0 + s * 0.1)):
                store.add(name, base, s, t0 + s * 0.1, v)
    engine = _Engine(store)
    [run] = status_json(engine, now=1105.0)["runs"]
    assert [(r["optimizer"], r["state"]) for r in run["ranks"]] == [("0", "idle"), ("1", "training")]
    assert run["state"] == "training"
    engine.pids = {("j", "r", 0, "0"): 11, ("j", "r", 0, "1"): 12}  # type: ignore[attr-defined]
    assert [r["state"] for r in status_json(engine, now=1105.0)["runs"][0]["ranks"]] == ["stalled", "training"]
    assert [r["state"] for r in status_json(_Engine(store), now=1140.0)["runs"][0]["ranks"]] == ["stalled"] * 2


class _Fed:
    """A real engine on a test clock, fed 20 steps of one rank, 0.5 s apart."""

    def __init__(self) -> None:
        from sentinel.engine.engine import Engine
        from tests.unit.engine.test_crash import Clock

        self.clock = Clock()
        self.engine = Engine(clock=self.clock)
        for step in range(1, 21):
            self.clock.t += 0.5
            self.step(step)

    def feed(self, **f: object) -> None:
        from sentinel import wire

        self.engine.feed(wire.encode({"job": "j", "run": "r", "rank": 0, "world": 1, "t": self.clock.t, **f}))

    def step(self, step: int) -> None:
        self.feed(kind="step", step=step, groups=["a"], grad_sumsq=[1.0], step_seconds=0.5)


def test_a_stalled_rank_shows_the_call_its_training_thread_waits_in() -> None:
    """A real engine fed a rank's steps and then its ``where``: the status page's rank row
    holds it while the rank is stalled, and not once it steps again."""
    fed = _Fed()
    fed.clock.t += 20
    fed.feed(kind="log", step=20, where="wait (threading.py:331) from load_batch (train.py:40)")
    [rank] = status_json(fed.engine, now=fed.clock.t + 60)["runs"][0]["ranks"]
    assert rank["state"] == "stalled" and rank["where"] == "wait (threading.py:331) from load_batch (train.py:40)"
    fed.clock.t += 60
    fed.step(21)
    [rank] = status_json(fed.engine, now=fed.clock.t + 60)["runs"][0]["ranks"]
    assert rank["state"] == "stalled" and "where" not in rank


def test_a_kernel_waiting_between_cells_shows_as_waiting_and_an_evaluation_as_evaluating() -> None:
    """A real engine fed a rank's steps, then heartbeats: the notebook's idle thread sends
    ``beat=0`` (no work: a kernel waiting for its next cell), an evaluation's forwards a
    count of them."""
    def state_after(beat: int) -> str:
        fed = _Fed()
        for _ in range(4):  # a minute of heartbeats, no step
            fed.clock.t += 20
            fed.feed(kind="log", step=20, beat=beat)
        doc = status_json(fed.engine, now=fed.clock.t + 1)
        [rank] = doc["runs"][0]["ranks"]
        assert doc["runs"][0]["state"] == rank["state"]
        return str(rank["state"])

    assert state_after(0) == "waiting"
    assert state_after(12) == "evaluating"
