"""Issue 18, point 2: each optimizer of a process is its own stream (a GAN's two).

The engine, the alerts, the history and the status page keep the streams apart by the
frames' ``opt`` (the ``optimizer`` label); the instrument labels its frames when the
process has several optimizers, and not when it has one.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.history.recorder import Recorder
from sentinel.serve.exporter import StoreCollector
from sentinel.serve.snapshot import status_json
from sentinel.store import labels_of
from tests.helpers import MLP, CaptureSender, make_monitor


def _frame(step: int, opt: str | None, norm: float, *, rank: int = 0, world: int = 1, kind: str = "step",
           **extra: Any) -> bytes:
    f: dict[str, Any] = {"kind": kind, "job": "j", "run": "gan", "rank": rank, "world": world, "step": step,
                         "t": 1000.0 + step, **extra}
    if kind == "step":
        f.update(groups=["a"], grad_sumsq=[norm * norm], scalars={"loss": norm})
    if opt is not None:
        f["opt"] = opt
    return wire.encode(f)


def _gan(engine: Engine, steps: int, nan_in_g_at: int | None = None) -> None:
    """The discriminator (stream "0") and the generator ("1") each step once per iteration."""
    for step in range(1, steps + 1):
        assert engine.feed(_frame(step, "0", 1.0))
        g = math.nan if step == nan_in_g_at else 3.0
        assert engine.feed(_frame(step, "1", g))


def test_two_streams_have_their_own_series_and_step_counts() -> None:
    engine = Engine(clock=lambda: 0.0)
    _gan(engine, 20)
    assert engine.feed(_frame(21, "0", 1.0))  # the discriminator steps once more
    d, g = (labels_of(job="j", run="gan", rank=0, optimizer=o) for o in ("0", "1"))
    assert engine.store.last("sentinel_step", d)[2] == 21.0  # type: ignore[index]
    assert engine.store.last("sentinel_step", g)[2] == 20.0  # type: ignore[index]
    assert engine.store.last("sentinel_grad_norm", g)[2] == 3.0  # type: ignore[index]
    assert engine.store.last("sentinel_loss", d)[2] == 1.0  # type: ignore[index]
    # nothing was written under the rank alone: no series mixes the two
    assert engine.store.last("sentinel_step", labels_of(job="j", run="gan", rank=0)) is None
    body, _ = StoreCollector(engine.store).exposition("text/plain")  # /metrics names the streams
    assert b'sentinel_step{job="j",optimizer="1",rank="0",run="gan"} 20.0' in body, body[:2000]


def test_an_alert_names_the_stream_it_fired_on() -> None:
    engine = Engine(clock=lambda: 0.0)
    _gan(engine, 12, nan_in_g_at=10)
    engine.tick(now=100.0)
    alert = next(a for a in engine.alerts_json() if a["alertname"] == "TrainingNonFinite")
    assert alert["optimizers"] == ["1"], alert
    assert "rank 0 (optimizer 1)" in alert["summary"], alert["summary"]


def test_no_alert_compares_one_optimizer_with_the_other() -> None:
    """Two DDP ranks, each with two optimizers of very different norms: the ranks agree
    stream by stream, so nothing diverges (mixed, the norms would differ by 5×)."""
    engine = Engine(clock=lambda: 0.0)
    for step in range(1, 40):
        for rank in (0, 1):
            for opt, norm in (("0", 1.0), ("1", 5.0)):
                assert engine.feed(_frame(step, opt, norm, rank=rank, world=2, ddp=True, busy_seconds=0.1))
    engine.tick(now=100.0)
    assert not [a for a in engine.alerts_json() if a["alertname"] in ("RankDivergence", "RankStraggler")]
    dev = engine.store.last("sentinel_rank_grad_norm_deviation",
                            labels_of(job="j", run="gan", rank=1, optimizer="1"))
    assert dev is not None and dev[2] == 0.0


def test_the_rank_ends_with_its_last_stream(tmp_path: Path) -> None:
    """One history run holds both streams: finished once both said goodbye, with both
    optimizers, the first stream's samples in ``samples`` and the second's apart."""
    path = tmp_path / "h.sqlite"
    rec = Recorder(path, flush_seconds=0.05)
    engine = Engine(clock=lambda: 0.0)
    engine.frame_listeners.append(rec.offer_frame)
    optim = {"class": "Adam", "dtype": "float32", "hp": {"lr": 2e-4}}
    for step in range(1, 6):
        assert engine.feed(_frame(step, "0", 1.0, optim=[optim]))
        assert engine.feed(_frame(step, "1", 3.0, optim=[{**optim, "class": "AdamW"}]))
    assert engine.feed(_frame(5, "0", 0.0, kind="bye"))
    assert engine.rules.ranks("j", "gan") == {0}  # the generator still reports
    assert engine.feed(_frame(6, "1", 3.0))
    assert engine.feed(_frame(6, "1", 0.0, kind="bye"))
    assert engine.rules.ranks("j", "gan") == set()
    assert ("j", "gan", 0) in engine.finished
    assert rec.flush()
    rec.close()
    db = sqlite3.connect(path)
    rows = db.execute("SELECT state, steps, optimizer, ranks FROM runs WHERE run = 'gan'").fetchall()
    assert len(rows) == 1, rows
    state, steps, optimizer, ranks = rows[0]
    assert (state, steps, ranks) == ("finished", 5, 1)
    assert "Adam" in optimizer and "AdamW" in optimizer
    assert [r[0] for r in db.execute("SELECT grad_norm FROM samples ORDER BY step")] == [1.0] * 5
    assert db.execute("SELECT stream, COUNT(*), MAX(grad_norm) FROM stream_samples GROUP BY stream").fetchall() \
        == [("1", 6, 3.0)]


def test_the_status_page_shows_a_row_per_stream() -> None:
    engine = Engine(clock=lambda: 0.0)
    _gan(engine, 5)
    doc = status_json(engine, now=1010.0)
    run = next(r for r in doc["runs"] if r["run"] == "gan")
    assert sorted((r["rank"], r.get("optimizer")) for r in run["ranks"]) == [(0, "0"), (0, "1")]
    assert set(doc["charts"]["loss"]["ranks"]) == {"0 (optimizer 0)", "0 (optimizer 1)"}


def test_a_bad_stream_label_refuses_the_frame() -> None:
    engine = Engine(clock=lambda: 0.0)
    for bad in ("x", "", "123", 7):
        data = wire.encode({"kind": "step", "job": "j", "run": "r", "rank": 0, "step": 1, "t": 1.0, "opt": bad})
        assert not engine.feed(data)
    assert engine.refused.get("schema") == 4


def _two_monitors() -> tuple[list[CaptureSender], list[Any]]:
    torch.manual_seed(0)
    d, g = MLP(), MLP()
    opt_d, opt_g = torch.optim.Adam(d.parameters(), 1e-3), torch.optim.Adam(g.parameters(), 1e-3)
    (mon_d, sd), (mon_g, sg) = make_monitor(d, opt_d), make_monitor(g, opt_g)
    for _ in range(3):
        for model, opt, mon in ((d, opt_d, mon_d), (g, opt_g, mon_g)):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(torch.randn(4, 16)), torch.zeros(4, 1))
            loss.backward()
            opt.step()
            mon.log(loss=loss)
    mon_d.close()
    mon_g.close()
    return [sd, sg], [mon_d, mon_g]


def test_two_watched_optimizers_label_their_frames_in_creation_order() -> None:
    (sd, sg), _ = _two_monitors()
    assert {f.get("opt") for f in sd.frames} == {"0"}
    assert {f.get("opt") for f in sg.frames} == {"1"}
    assert [f["step"] for f in sg.steps()] == [1, 2, 3]
    bye = [f for f in sg.frames if f["kind"] == "bye"]
    assert len(bye) == 1 and bye[0]["opt"] == "1"


def _alone(steps: int) -> tuple[Any, CaptureSender]:
    """A monitor of one SGD over an MLP after ``steps`` steps (left open)."""
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    mon, sender = make_monitor(model, opt)
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(4, 16)).sum()
        loss.backward()
        opt.step()
        mon.log(loss=loss)  # the step's report leaves now
    return mon, sender


def test_one_optimizer_sends_no_stream_label() -> None:
    mon, sender = _alone(2)
    mon.close()
    assert sender.frames and all("opt" not in f for f in sender.frames)


def test_a_monitor_left_open_by_an_earlier_run_does_not_make_a_second_stream() -> None:
    """A notebook cell run again, a script's second experiment: the first monitor was never
    closed and had reported before the second was made, so the second is alone (no label)."""
    old, old_sender = _alone(1)
    assert old_sender.frames and all("opt" not in f for f in old_sender.frames)
    mon, sender = _alone(2)
    mon.close()
    old.close()
    assert sender.frames and all("opt" not in f for f in sender.frames)
