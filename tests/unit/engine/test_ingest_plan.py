"""The ingest keeps, per rank, the series its gauges go to (``store.Plan``) and the label
sets of its groups: what it kept must never outlive what the store holds."""

from __future__ import annotations

from typing import Any

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.engine.validate import Limits
from sentinel.store import Plan, Series, Store, labels_of

BASE = labels_of(job="j", run="r", rank=0)


def _frame(step: int, groups: tuple[str, ...] = ("a", "b"), run: str = "r", **extra: Any) -> bytes:
    return wire.encode({"kind": "step", "job": "j", "run": run, "rank": 0, "world": 1, "step": step,
                        "t": 1000.0 + step, "groups": list(groups), "grad_sumsq": [4.0] * len(groups),
                        "amp": {"scale": 1024.0}, "scalars": {"loss": float(step)}, **extra})


def test_a_planned_row_follows_a_series_dropped_replaced_or_removed() -> None:
    store, plan = Store(capacity=8), Plan(BASE)
    store.add_planned(plan, [("m", 1.0), (("m", ("source", "x")), 2.0)], 1, 1.0)
    kept = store.series("m", BASE)
    assert isinstance(kept, Series) and store.last("m", tuple(sorted(BASE + (("source", "x"),)))) == (1, 1.0, 2.0)
    store.drop("j", "r")
    store.add_planned(plan, [("m", 3.0)], 2, 2.0)
    assert store.series("m", BASE) is not kept and store.window("m", BASE).values.tolist() == [3.0]  # type: ignore[union-attr]
    store.add_row("m", (BASE,), [4.0], 3, 3.0)  # the series becomes a column of a block
    store.add_planned(plan, [("m", 5.0)], 4, 4.0)
    assert isinstance(store.series("m", BASE), Series) and store.last("m", BASE) == (4, 4.0, 5.0)
    store.remove("m", BASE)
    store.add_planned(plan, [("m", 6.0)], 5, 5.0)
    assert store.last("m", BASE) == (5, 5.0, 6.0) and "m" in store.written


def test_a_run_dropped_and_started_again_gets_its_series_and_counters_back() -> None:
    clock = [0.0]
    engine = Engine(clock=lambda: clock[0], ended_ttl=1.0, idle_ttl=10.0)
    for step in range(1, 4):
        assert engine.feed(_frame(step))
    clock[0] = 1e6
    engine.tick(clock[0])
    assert engine.runs_dropped == 1 and engine.store.last("sentinel_loss", BASE) is None
    assert engine.feed(_frame(1))
    store = engine.store
    assert store.window("sentinel_loss", BASE).values.tolist() == [1.0]  # type: ignore[union-attr]
    assert store.last("sentinel_group_grad_norm", labels_of(job="j", run="r", rank=0, group="a")) == (1, 1001.0, 2.0)
    assert "sentinel_amp_skipped_steps_total" in store.names()
    assert store.labelsets("sentinel_nonfinite_total")  # back at 0, from the first report
    assert store.counter("sentinel_amp_skipped_steps_total", BASE) == 0.0


def test_a_rank_whose_groups_change_writes_the_new_groups() -> None:
    engine = Engine()
    engine.feed(_frame(1, ("a", "b")))
    engine.feed(_frame(2, ("a", "c")))
    engine.feed(_frame(3, ("a", "c")))
    last = {g: engine.store.last("sentinel_group_grad_norm", labels_of(job="j", run="r", rank=0, group=g))
            for g in "abc"}
    assert last == {"a": (3, 1003.0, 2.0), "b": (1, 1001.0, 2.0), "c": (3, 1003.0, 2.0)}


def test_a_known_rank_naming_something_new_is_still_held_to_the_caps() -> None:
    engine = Engine(limits=Limits(max_scalar_names=2))
    assert engine.feed(_frame(1))
    assert engine.feed(_frame(2, scalars={"loss": 1.0, "acc": 0.5}))
    assert engine.feed(_frame(3, scalars={"loss": 1.0, "acc": 0.5, "f1": 0.1}))  # f1 is one too many
    assert engine.fields_dropped == {("scalars", "scalars"): 1}
    assert engine.store.last("sentinel_scalar", labels_of(job="j", run="r", rank=0, name="acc")) == (3, 1003.0, 0.5)
    assert engine.store.last("sentinel_scalar", labels_of(job="j", run="r", rank=0, name="f1")) is None


def test_groups_that_change_and_change_back_keep_every_group_current() -> None:
    """A rank whose groups go A, then B, then A again (the same label tuples, as the ingest
    caches them): a group in both lists still gets each new sample."""
    store = Store(capacity=8)
    a_ls, b_ls, c_ls = (labels_of(job="j", run="r", rank=0, group=g) for g in ("a", "b", "c"))
    first, second = (a_ls, b_ls), (a_ls, c_ls)
    store.add_row("m", first, [1.0, 2.0], 1, 1.0)
    store.add_row("m", second, [3.0, 4.0], 2, 2.0)
    store.add_row("m", first, [5.0, 6.0], 3, 3.0)
    assert store.last("m", a_ls) == (3, 3.0, 5.0) and store.last("m", b_ls) == (3, 3.0, 6.0)
    store.add_row("m", second, [7.0, 8.0], 4, 4.0)
    assert store.last("m", a_ls) == (4, 4.0, 7.0) and store.last("m", c_ls) == (4, 4.0, 8.0)


def test_a_step_with_no_gradient_at_all_stays_out_of_the_gradient_noise() -> None:
    """A margin loss that every sample of most batches meets (a triplet loss once the
    embeddings separate) leaves the gradient exactly 0 at those steps: they carry no noise
    figure, and GVR is that of the steps with a gradient (steady here: 0, not the 1.0 that
    alternating zeros made of it)."""
    engine = Engine()
    for step in range(1, 61):
        assert engine.feed(_frame(step, grad_sumsq=[4.0, 0.0] if step % 2 else [0.0, 0.0]))
    last = engine.store.last("sentinel_gradient_variance_ratio", BASE)
    assert last is not None and last[2] == 0.0
    norm = engine.store.last("sentinel_grad_norm", BASE)
    assert norm is not None and norm[2] == 0.0  # the norm itself is recorded as ever
