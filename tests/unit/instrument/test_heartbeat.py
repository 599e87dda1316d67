"""The training side of the heartbeat: forward passes between steps (an evaluation) send a
log frame with ``beat`` at most once per ``heartbeat_seconds``; a training loop never does.

Real monitor, real model; its frames go to a real engine (``CaptureSender``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from tests.helpers import MLP, CaptureSender, make_monitor

EVERY = 0.25  # heartbeat_seconds here (20 s by default)


def _watched(with_model: bool = True) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, CaptureSender]:
    """An MLP, its SGD, and a monitor of them (of the optimizer alone without ``with_model``)
    that beats every :data:`EVERY` seconds."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon, sender = make_monitor(model if with_model else None, opt, heartbeat_seconds=EVERY)
    return model, opt, mon, sender


def _due(mon: Any) -> None:
    """Make the next beat due at once, as if ``heartbeat_seconds`` had passed since the last
    step or beat (the tests that do not test the interval itself need not wait it out)."""
    mon.measure.heartbeat.due = 0.0


def _beats(sender: CaptureSender) -> list[dict[str, object]]:
    return [f for f in sender.frames if "beat" in f]


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, pause: float = 0.0) -> None:
    for _ in range(steps):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(pause)


def _evaluate(model: torch.nn.Module, seconds: float) -> int:
    n, end = 0, time.monotonic() + seconds
    model.eval()
    with torch.no_grad():
        while time.monotonic() < end:
            model(torch.randn(8, 16))
            n += 1
            time.sleep(0.005)
    model.train()
    return n


def test_an_evaluation_sends_heartbeats_and_training_does_not() -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt, heartbeat_seconds=EVERY)
    try:
        _train(model, opt, 30, pause=0.01)  # a step each 10-20 ms: never a beat
        assert _beats(sender) == []
        forwards = _evaluate(model, 4.5 * EVERY)
        beats = _beats(sender)
        assert len(beats) >= 2, [b["t"] for b in beats]  # one per 0.25 s from 0.25 s after the step
        assert all(b["kind"] == "log" and b["step"] == 30 for b in beats)
        counts = [b["beat"] for b in beats]
        assert counts == sorted(counts) and counts[-1] <= forwards  # forwards since the step
        assert sender.frames.index(beats[0]) > sender.frames.index(sender.steps()[-1])  # after the step's report
        ts = [float(b["t"]) for b in beats]  # type: ignore[arg-type]
        assert min(b - a for a, b in zip(ts, ts[1:])) >= EVERY * 0.9
        labels = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
        assert sender.engine.store.last("sentinel_last_heartbeat_timestamp_seconds", labels)[2] == ts[-1]
        _train(model, opt, 5)  # training again: the count starts over, no beat
        n = len(sender.frames)
        again = _evaluate(model, 1.5 * EVERY)
        later = [b for b in _beats(sender) if sender.frames.index(b) >= n]
        assert later and later[0]["step"] == 35 and later[0]["beat"] <= again  # counted from step 35
    finally:
        mon.close()


def test_a_training_loop_that_stops_stepping_sends_no_heartbeat() -> None:
    """Forward passes in training mode with gradients on are no evaluation: a loop that
    skips every step (a NaN loss, ``continue``) makes no progress, and its stall must page.
    The same forwards under ``no_grad`` or in ``eval()`` mode do beat."""
    model, opt, mon, sender = _watched()
    try:
        _train(model, opt, 3)
        end = time.monotonic() + 3 * EVERY
        while time.monotonic() < end:  # every batch's loss "bad": backward, but never a step
            model(torch.randn(8, 16)).pow(2).mean().backward()
            opt.zero_grad()
            time.sleep(0.005)
        assert _beats(sender) == []
        with torch.no_grad():
            model(torch.randn(8, 16))  # training mode, gradients off: an evaluation's forward
        assert len(_beats(sender)) == 1
        _due(mon)  # a beat is due now, as heartbeat_seconds after the last step
        model.eval()
        model(torch.randn(8, 16))  # eval mode, gradients on (a script that forgot no_grad)
        assert len(_beats(sender)) == 2
    finally:
        mon.close()


def test_no_heartbeat_before_the_first_step_nor_from_another_thread() -> None:
    model, opt, mon, sender = _watched()
    try:
        _evaluate(model, 3 * EVERY)  # a sanity evaluation before training: no step to be late for
        assert _beats(sender) == []
        _train(model, opt, 1)
        # DataParallel's replicas run the model's hooks in worker threads: they never send
        worker = threading.Thread(target=_evaluate, args=(model, 3 * EVERY))
        worker.start()
        worker.join()
        assert _beats(sender) == []
        _evaluate(model, 0.5 * EVERY)  # the training thread's own forwards do, the first at once
        assert len(_beats(sender)) == 1
    finally:
        mon.close()


def test_monitor_heartbeat_beats_without_a_watched_forward() -> None:
    model, opt, mon, sender = _watched(with_model=False)  # no model: no forward hook
    try:
        _train(model, opt, 3)
        end = time.monotonic() + 2.5 * EVERY
        while time.monotonic() < end:  # a generation loop through another object, a long upload
            mon.heartbeat()
            time.sleep(0.01)
        beats = _beats(sender)
        assert len(beats) >= 1 and beats[0]["step"] == 3 and int(beats[0]["beat"]) >= 5  # type: ignore[call-overload]
    finally:
        mon.close()
    n = len(_beats(sender))
    _due(mon)
    mon.heartbeat()  # closed: nothing more leaves
    assert len(_beats(sender)) == n


class _Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.fail_at:
            raise ValueError(f"bad row {i}")
        time.sleep(0.01)
        return torch.randn(16)


def test_an_evaluation_of_an_ema_copy_beats_through_its_loader_and_a_training_loader_does_not() -> None:
    """timm's and YOLO's shape: the EMA model, a deepcopy (no hook of Sentinel's in it), is
    validated each epoch under ``no_grad``; its loader's batches are the heartbeats."""
    import copy

    model, opt, mon, sender = _watched()
    try:
        _train(model, opt, 2)
        ema = copy.deepcopy(model).eval()
        _due(mon)  # a beat is due now, as heartbeat_seconds after the last step
        for x in torch.utils.data.DataLoader(_Rows(8), batch_size=4):  # gradients on: a training loader
            ema(x)
        assert _beats(sender) == []
        with torch.no_grad():
            for x in torch.utils.data.DataLoader(_Rows(8), batch_size=4):
                ema(x)
        assert len(_beats(sender)) == 1
    finally:
        mon.close()


def test_a_dataset_error_reaches_the_script_without_a_frame_of_sentinel() -> None:
    import traceback

    model, opt, mon, _ = _watched()
    try:
        _train(model, opt, 1)
        _due(mon)  # a beat is due now, as heartbeat_seconds after the last step
        try:
            with torch.no_grad():
                for x in torch.utils.data.DataLoader(_Rows(8, fail_at=5), batch_size=4):
                    model(x)
        except ValueError as e:
            text = "".join(traceback.format_exception(e))
        assert "bad row 5" in text and "sentinel/instrument" not in text and "dataloader.py" in text, text
    finally:
        mon.close()


def test_no_heartbeat_leaves_while_a_cuda_graph_is_being_captured(monkeypatch: Any) -> None:
    """A beat polls the reports' CUDA events, which a stream capture forbids (it would ruin
    the script's graph). No GPU here: the capture is faked, the only fake in this file."""
    model, opt, mon, sender = _watched()
    try:
        _train(model, opt, 1)
        _due(mon)  # a beat is due now, as heartbeat_seconds after the last step
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        _evaluate(model, 0.5 * EVERY)
        assert _beats(sender) == [] and mon.errors == 0
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        _due(mon)  # a beat is due now, as heartbeat_seconds after the last step
        _evaluate(model, 0.5 * EVERY)
        assert len(_beats(sender)) == 1
    finally:
        mon.close()


def test_an_lbfgs_steps_re_evaluations_beat() -> None:
    """A physics-informed network in the shape of the PyTorch ports of Raissi's PINNs: an Adam
    phase, then one ``LBFGS.step(closure)`` with a large ``max_iter`` over the same weights,
    the closure a forward in training mode whose residual takes ``autograd.grad`` of the
    output by its inputs. That one step runs for minutes in real scripts (max_iter 50,000),
    every forward in it a training forward, which beats nothing: the stall rule paged
    (TrainingStalled, critical) a healthy run. Each re-evaluation inside the step beats."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1, 20), torch.nn.Tanh(), torch.nn.Linear(20, 20), torch.nn.Tanh(),
                              torch.nn.Linear(20, 1))
    x = torch.linspace(-1.0, 1.0, 64).unsqueeze(1).requires_grad_(True)
    edges = torch.tensor([[-1.0], [1.0]])
    adam = torch.optim.Adam(net.parameters(), lr=1e-3)
    lbfgs = torch.optim.LBFGS(net.parameters(), lr=1.0, max_iter=60, tolerance_grad=0.0, tolerance_change=0.0,
                              history_size=50, line_search_fn="strong_wolfe")
    mon, sender = make_monitor(net, [adam, lbfgs], heartbeat_seconds=EVERY)
    calls = 0

    def loss_func() -> torch.Tensor:  # the residual of u'' = -pi^2 sin(pi x), u(-1) = u(1) = 0
        nonlocal calls
        calls += 1
        time.sleep(0.02)  # a real collocation set's forward and double backward
        u = net(x)
        u_x = torch.autograd.grad(u, x, torch.ones_like(u), create_graph=True)[0]
        u_xx = torch.autograd.grad(u_x, x, torch.ones_like(u_x), create_graph=True)[0]
        f = u_xx + torch.pi ** 2 * torch.sin(torch.pi * x)
        return f.pow(2).mean() + net(edges).pow(2).mean()

    try:
        for _ in range(20):
            adam.zero_grad()
            loss = loss_func()
            loss.backward()
            adam.step()
        assert _beats(sender) == []  # training: no beat
        reported = len(sender.steps())
        last = sender.steps()[-1]["step"]
        started = time.time()

        def closure() -> torch.Tensor:
            lbfgs.zero_grad()
            loss = loss_func()
            loss.backward()
            return loss

        lbfgs.step(closure)
        ended = time.time()
        beats = _beats(sender)
        assert calls - 20 > 60  # the one step evaluated its closure 60+ times, over 1.2 s or more
        assert len(beats) >= 3, [(b["t"], b["beat"]) for b in beats]
        # while the step ran, after the last step reported before it
        assert all(b["step"] == last and started < float(b["t"]) < ended for b in beats)  # type: ignore[arg-type]
        labels = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
        stored = sender.engine.store.last("sentinel_last_heartbeat_timestamp_seconds", labels)
        assert stored is not None and stored[2] == float(beats[-1]["t"])  # type: ignore[arg-type]
        assert len(sender.steps()) == reported + 1  # and the LBFGS step is reported as one step
    finally:
        mon.close()
