"""A dead embedded engine process is logged once in the training process, training goes
on, and the engine is started again after a backoff, counted (issue 10, item 6)."""

from __future__ import annotations

import logging
import os
import signal
import urllib.request

import pytest
import torch

import sentinel
from sentinel.daemon import launch as link  # EngineProcess lives with the daemon side
from tests.helpers import MLP, wait_for

pytestmark = pytest.mark.integration


def _metrics(url: str) -> str:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def _step(model: MLP, opt: torch.optim.Optimizer, mon: sentinel.Monitor) -> None:
    x = torch.randn(8, 16)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    mon.log(loss=loss)


def test_a_killed_engine_is_logged_once_and_restarted(caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link, "RESTART_DELAYS", (0.5,))
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = sentinel.watch(model, opt, run="respawn", listen="127.0.0.1:0", engine="process")
    try:
        engine = mon.engine.shared  # the monitor holds a link.EngineShare
        assert isinstance(engine, link.EngineProcess)
        for _ in range(3):
            _step(model, opt, mon)
        first_pid = engine.proc.pid
        os.kill(first_pid, signal.SIGKILL)
        engine.proc.wait(10)
        with caplog.at_level(logging.WARNING, logger="sentinel"):
            # training goes on; the engine comes back and receives the frames again
            wait_for(lambda: (_step(model, opt, mon), engine.restarts == 1 and engine.url
                              and "sentinel_engine_restarts_total 1.0" in _metrics(engine.url)
                              and 'run="respawn"' in _metrics(engine.url))[1],
                     timeout=60, what="the engine to be restarted and to receive frames")
        assert engine.proc.pid != first_pid and engine.deaths == 1
        deaths = [r for r in caplog.records if "engine process" in r.getMessage()]
        assert len(deaths) == 1, [r.getMessage() for r in deaths]
        assert f"(pid {first_pid}) was killed by SIGKILL" in deaths[0].getMessage()
        assert mon.errors == 0
    finally:
        mon.close()


def test_a_crash_loop_gives_up_after_the_last_restart(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(link, "RESTART_DELAYS", (0.0,))
    monkeypatch.setattr(link, "MAX_RESTARTS", 2)
    monkeypatch.setattr(link, "CHECK_SECONDS", 0.0)
    engine = link.EngineProcess("127.0.0.1:0", None)
    try:
        with caplog.at_level(logging.WARNING, logger="sentinel"):
            def kill_and_poll() -> bool:
                if engine.proc.poll() is None:
                    engine.proc.kill()
                    engine.proc.wait(10)
                engine.poll()
                return engine.deaths == 3
            wait_for(kill_and_poll, timeout=60, what="three deaths")
            for _ in range(5):
                engine.poll()
        assert engine.restarts == 2 and engine.proc.poll() is not None  # no third restart
        lines = [r.getMessage() for r in caplog.records if "engine process" in r.getMessage()]
        assert len(lines) == 2 and "giving up" in lines[1]
    finally:
        engine.stop()


def test_the_engine_process_runs_below_the_training_process() -> None:
    """docs/instrumenting.md: the engine `watch` starts runs at a lower CPU priority (nice +10,
    and the batch scheduling policy), so the training job comes first on shared cores."""
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = sentinel.watch(model, opt, run="priority", listen="127.0.0.1:0", engine="process")
    try:
        engine = mon.engine.shared  # the monitor holds a link.EngineShare
        assert isinstance(engine, link.EngineProcess)
        pid = engine.proc.pid
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
        assert os.sched_getscheduler(pid) == os.SCHED_BATCH
    finally:
        mon.close()
