"""A watched script profiled with ``torch.profiler`` (PyTorch's profiler recipe): Sentinel's
operators and time are under ranges named for it, not mixed into the script's. Unlabelled,
its gradient reads came out as operators the script never called and as AdamW's own time
(``Optimizer.step#AdamW.step`` took 2.5 times its plain run's self CPU time)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import sentinel
from sentinel.instrument import monitor, profiled
from tests.helpers import CaptureSender

STEPS = 4


@pytest.fixture
def sender(monkeypatch: pytest.MonkeyPatch) -> CaptureSender:
    capture = CaptureSender()
    monkeypatch.setattr(monitor, "connect", lambda options: (capture, None, None))  # frames stay here
    return capture


def _train(model: nn.Module, opt: torch.optim.Optimizer, mon: object | None, steps: int) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if mon is not None:
            mon.log(loss=loss)  # type: ignore[attr-defined]


def _profiled(tmp: Path, name: str, watch: bool) -> tuple[list[dict], Counter[str]]:
    """The trace's complete events of STEPS steps after two unprofiled ones, and the
    operators' counts outside Sentinel's ranges."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = sentinel.watch(model, opt) if watch else None
    _train(model, opt, mon, 2)  # Adam's state made, the monitor's layout read
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _train(model, opt, mon, STEPS)
    if mon is not None:
        mon.close()
    path = tmp / f"{name}.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    ranges = [(e["tid"], e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("sentinel:")]
    outside = Counter(e["name"] for e in events if not e["name"].startswith("sentinel:") and not any(
        t == e["tid"] and a <= e["ts"] and e["ts"] + e["dur"] <= b for t, a, b in ranges))
    return events, outside


def test_sentinels_work_is_under_its_own_ranges_in_a_profile(sender: CaptureSender, tmp_path: Path) -> None:
    _, plain = _profiled(tmp_path, "plain", watch=False)
    events, watched = _profiled(tmp_path, "watched", watch=True)
    assert [f["step"] for f in sender.steps()] == [1, 2, 3, 4, 5, 6]  # it did watch them

    # the script's operators, as many as in its plain run: none of Sentinel's among them
    assert {k: v for k, v in watched.items() if k.startswith("aten::")} == {
        k: v for k, v in plain.items() if k.startswith("aten::")}
    names = Counter(e["name"] for e in events if e["name"].startswith("sentinel:"))
    assert names[profiled.STEP] >= 2 * STEPS  # each step's pre- and post-hook
    assert names[profiled.BACKWARD] >= STEPS and names[profiled.CLIP] == STEPS and names[profiled.LOG] == STEPS
    # and the gradient reads are there, under Sentinel's name
    step_ranges = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == profiled.STEP]
    inside = {e["name"] for e in events if e["name"].startswith("aten::")
              and any(a <= e["ts"] and e["ts"] + e["dur"] <= b for a, b in step_ranges)}
    assert inside, "no operator of Sentinel's step hooks in the trace"


def test_without_a_profiler_nothing_is_recorded(sender: CaptureSender) -> None:
    calls: list[str] = []
    original = torch.autograd.profiler.record_function

    class Spy(original):  # type: ignore[misc, valid-type]
        def __init__(self, name: str, *args: object) -> None:
            calls.append(name)
            super().__init__(name, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.autograd.profiler, "record_function", Spy)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon = sentinel.watch(model, opt)
        _train(model, opt, mon, 3)
        mon.close()
    assert [f["step"] for f in sender.steps()] == [1, 2, 3]
    assert not [c for c in calls if c.startswith("sentinel:")]
