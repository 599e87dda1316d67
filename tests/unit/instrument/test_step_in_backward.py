"""An optimizer step fused into the backward pass (PyTorch's tutorial of that name,
torchtune's ``optimizer_in_bwd``): an optimizer per parameter, stepped by the parameter's
``register_post_accumulate_grad_hook``. On CUDA those hooks run in autograd's device thread,
a thread Python did not start, while the training thread waits inside ``backward()``. The
monitor took that thread for its training's, and no later ``backward()`` of the training
thread gave it its loss. Here the hooks step on such a thread (``_thread.start_new_thread``),
as CUDA's would, while the training thread waits in its ``backward()``.

The zero-code side (one stream of all the optimizers) is ``tests/programs/optimizer_in_backward.py``."""

from __future__ import annotations

import _thread
import threading

import pytest
import torch

import sentinel
from sentinel.instrument import losses, monitor
from tests.helpers import MLP, CaptureSender


def _on_a_foreign_thread(fn: object, arg: object) -> None:
    """Run ``fn(arg)`` on a thread Python did not start, and wait for it."""
    done = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            assert isinstance(threading.current_thread(), threading._DummyThread)  # type: ignore[attr-defined]
            fn(arg)  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001  (handed to the training thread)
            failed.append(exc)
        finally:
            done.set()

    _thread.start_new_thread(run, ())
    assert done.wait(30)
    if failed:
        raise failed[0]


def test_steps_in_autograds_thread_keep_the_training_threads_losses(monkeypatch: pytest.MonkeyPatch) -> None:
    sender = CaptureSender()
    monkeypatch.setattr(monitor, "connect", lambda options: (sender, None, None))
    torch.manual_seed(0)
    model = MLP()
    optimizers = {p: torch.optim.Adam([p], lr=1e-3) for p in model.parameters()}

    def step(p: torch.Tensor) -> None:
        optimizers[p].step()
        optimizers[p].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: _on_a_foreign_thread(step, p))
    mon = sentinel.watch(model, list(optimizers.values()), capture_loss=True)
    gen = torch.Generator().manual_seed(0)
    ref = []
    try:
        for _ in range(5):
            x = torch.randn(16, 16, generator=gen)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            loss.backward()
            ref.append(loss.item())
        assert mon.stepped_in == threading.get_ident()  # the training's thread, not autograd's
    finally:
        mon.close()
    steps = sender.steps()
    assert [f["step"] for f in steps] == [1, 2, 3, 4, 5]  # one stream: a step when every optimizer has stepped
    assert [f["scalars"]["loss"] for f in steps] == pytest.approx(ref, rel=1e-6)


def test_the_caller_is_the_thread_in_backward_only_from_a_foreign_thread() -> None:
    losses.install()  # backward() says which thread is in it
    me = threading.get_ident()
    assert losses.caller() == me
    seen: list[int] = []
    box = torch.zeros(1, requires_grad=True)
    box.register_post_accumulate_grad_hook(lambda p: _on_a_foreign_thread(lambda _: seen.append(losses.caller()), p))
    (box * 2).sum().backward()
    assert seen == [me]
    other: list[int] = []
    thread = threading.Thread(target=lambda: other.append(losses.caller()))  # a thread of the script's own
    thread.start()
    thread.join()
    assert other == [thread.ident]
