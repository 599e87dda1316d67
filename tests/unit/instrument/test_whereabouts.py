"""Where a training thread waits once no step comes (``instrument/whereabouts.py``): read
from a real thread's stack, sent once per place, never while it steps."""

from __future__ import annotations

import re
import sys
import threading
from typing import Any

import torch

from sentinel.instrument import whereabouts
from tests.helpers import MLP, make_monitor, train_steps

HERE = "tests/unit/instrument/test_whereabouts.py"


def wait_for_peer(ready: threading.Event, go: threading.Event) -> None:
    ready.set()
    go.wait(30)


def test_the_place_is_the_innermost_call_and_the_scripts_line_that_made_it() -> None:
    ready, go = threading.Event(), threading.Event()
    t = threading.Thread(target=wait_for_peer, args=(ready, go))
    t.start()
    try:
        ready.wait(10)
        where = whereabouts.describe(sys._current_frames()[t.ident])  # type: ignore[index]
    finally:
        go.set()
        t.join()
    line = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1) if "go.wait(30)" in text)
    assert re.fullmatch(rf"wait \(threading\.py:\d+\) from wait_for_peer \({HERE}:{line}\)", where), where


def test_a_monitor_that_stopped_stepping_says_where_once_per_place() -> None:
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    made = threading.Event()
    box: dict[str, Any] = {}
    waiting, more, stepped = threading.Event(), threading.Event(), threading.Event()

    def training() -> None:  # the monitor's training thread: 3 steps, a wait, 1 step
        box["mon"], box["sender"] = make_monitor(model, opt)
        made.set()
        train_steps(model, opt, 3, box["mon"])
        waiting.set()
        more.wait(30)
        train_steps(model, opt, 1, box["mon"], seed=1)
        stepped.set()

    t = threading.Thread(target=training)
    t.start()
    try:
        made.wait(10)
        waiting.wait(10)
        mon, sender = box["mon"], box["sender"]
        looked: dict[int, tuple[int, str]] = {}

        def said() -> list[tuple[int, str]]:
            return [(f["step"], f["where"]) for f in sender.frames if "where" in f]

        whereabouts._look([mon], looked)  # the first look: it may have just stepped
        assert said() == []
        whereabouts._look([mon], looked)  # no step since: where it waits
        whereabouts._look([mon], looked)  # the same place: nothing more
        [(step, where)] = said()
        assert step == 3 and where.startswith("wait (threading.py:") and "from training (" + HERE in where, where
        more.set()
        stepped.wait(10)
        whereabouts._look([mon], looked)  # it stepped: nothing said
        assert len(said()) == 1
    finally:
        more.set()
        t.join()
        box["mon"].close()
    assert not [f for f in sender.steps() if "where" in f]  # step frames never carry it
