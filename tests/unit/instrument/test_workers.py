"""Hogwild (pytorch/examples ``mnist_hogwild``): ``multiprocessing`` workers that each step
their own optimizer share their parent's rank. Each is its own stream, named by the
worker's number, and each says goodbye when its target returns, although a forked worker
leaves through ``os._exit`` and never runs ``atexit``.

Real forked processes; their frames come back to the test through a queue.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import torch
from torch import nn

from sentinel import wire
from sentinel.instrument import registry
from tests.helpers import MLP, make_monitor


class _QueueSender:
    """Sends each frame to the parent (the worker's own copy of the test has no engine)."""

    def __init__(self, queue: Any) -> None:
        self.queue, self.dropped = queue, 0

    def send(self, data: bytes) -> bool:
        self.queue.put(data)
        return True

    def close(self) -> None:
        pass


def _worker(queue: Any, seed: int) -> None:
    torch.manual_seed(seed)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)  # its own optimizer, as mnist_hogwild's train()
    mon, _ = make_monitor(model, opt, sender=_QueueSender(queue))  # type: ignore[arg-type]
    for _ in range(2):
        opt.zero_grad()
        loss = model(torch.randn(4, 16)).square().mean()
        loss.backward()
        opt.step()
        mon.log(loss=loss)
    # left open, as a script leaves it: the worker's exit must close it


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_hogwild_workers_are_streams_of_their_own_and_say_goodbye() -> None:
    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    workers = [ctx.Process(target=_worker, args=(queue, k)) for k in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)  # a few small frames: the pipe holds them all
    hung = [w.pid for w in workers if w.is_alive()]
    for w in workers:
        if w.is_alive():
            w.kill()
            w.join()
    assert not hung, f"workers {hung} did not finish in 120 s"
    assert [w.exitcode for w in workers] == [0, 0]
    frames = []
    while not queue.empty():
        frames.append(wire.decode(queue.get()))
    labels = [str(w._identity[0] - 1) for w in workers]  # type: ignore[attr-defined]  # Process-N: "N-1"
    for label in labels:
        mine = [f for f in frames if f.get("opt") == label]
        assert [f["step"] for f in mine if f["kind"] == "step"] == [1, 2], (label, frames)
        assert [f["kind"] for f in mine][-1] == "bye", (label, [f["kind"] for f in mine])
    assert all(f.get("opt") in labels for f in frames), [f.get("opt") for f in frames]


def test_a_main_process_is_no_worker() -> None:
    assert registry.worker_number() is None
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon, sender = make_monitor(model, opt)
    opt.zero_grad()
    nn.functional.mse_loss(model(torch.randn(4, 16)), torch.zeros(4, 1)).backward()
    opt.step()
    mon.close()
    assert sender.frames and all("opt" not in f for f in sender.frames)
