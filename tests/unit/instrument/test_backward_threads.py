"""A ``backward()`` in one thread while another thread's ``backward()`` runs (trials in
threads, Optuna's ``n_jobs``): each is its own thread's, whichever way each calls it.

The overlap is forced: the first thread's graph holds a gate whose backward waits until the
second thread's step is over, so the second thread's whole step runs inside the first
thread's backward pass (autograd runs a CPU graph's backward in the calling thread, without
the GIL while it computes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers import MLP, make_monitor

Backward = Callable[[torch.Tensor], None]
CALLS: dict[str, Backward] = {
    "Tensor.backward": lambda loss: loss.backward(),
    "torch.autograd.backward": lambda loss: torch.autograd.backward(loss),
    "torch.autograd.backward([loss])": lambda loss: torch.autograd.backward([loss]),
}


class _Gate(torch.autograd.Function):
    """The identity, whose backward says it began and waits for ``release``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, began: threading.Event, release: threading.Event) -> torch.Tensor:
        ctx.began, ctx.release = began, release
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.began.set()
        assert ctx.release.wait(30), "the other thread's step never ended"
        return g, None, None


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 16, generator=gen)
    return x, x.sum(dim=1, keepdim=True)


@pytest.mark.parametrize("outer", list(CALLS))
@pytest.mark.parametrize("inner", list(CALLS))
def test_a_backward_inside_another_threads_backward_is_its_own_threads(outer: str, inner: str) -> None:
    """The second thread's step, taken while the first thread is inside its backward pass,
    reports that step's loss, as the first thread's step reports its own. A process-wide
    count of calls in progress read the second thread's ``torch.autograd.backward`` as a
    nested call of the first one's (a re-entrant checkpoint's) and let it through unseen, and
    the first thread's ``Tensor.backward`` put torch's own ``torch.autograd.backward`` in place
    for the whole process while it ran: the second thread's step went without its loss."""
    torch.manual_seed(0)
    model_a, model_b = MLP(), MLP()
    opt_a = torch.optim.SGD(model_a.parameters(), lr=0.01)
    opt_b = torch.optim.SGD(model_b.parameters(), lr=0.01)
    began, released = threading.Event(), threading.Event()
    losses: dict[str, list[float]] = {"a": [], "b": []}
    errors: list[BaseException] = []
    monitors: dict[str, Any] = {}

    def train(name: str, model: nn.Module, opt: torch.optim.Optimizer, call: Backward, gated: bool) -> None:
        try:
            monitors[name] = make_monitor(model, opt, capture_loss=True)
            for step in range(3):
                x, y = _batch(10 * step + (name == "b"))
                out = model(x)
                if gated and step == 2:  # this step's backward waits for the other thread's step 3
                    out = _Gate.apply(out, began, released)
                loss = nn.functional.mse_loss(out, y)
                losses[name].append(loss.item())
                opt.zero_grad()
                call(loss)
                opt.step()
                if not gated and step == 1:
                    assert began.wait(30), "the first thread's backward never began"
        except BaseException as e:  # noqa: BLE001  (handed to the test's thread)
            errors.append(e)
        finally:
            if not gated:
                released.set()

    first = threading.Thread(target=train, args=("a", model_a, opt_a, CALLS[outer], True))
    second = threading.Thread(target=train, args=("b", model_b, opt_b, CALLS[inner], False))
    first.start()
    second.start()
    first.join(60)
    second.join(60)
    assert not errors, errors
    for name in ("a", "b"):
        mon, sender = monitors[name]
        mon.close()
        steps = sender.steps()
        assert [f["step"] for f in steps] == [1, 2, 3], name
        assert [f["scalars"]["loss"] for f in steps] == pytest.approx(losses[name], rel=1e-6), name


def test_a_backward_from_a_thread_python_did_not_start_during_a_pass_is_nested() -> None:
    """On CUDA a re-entrant checkpoint's nested ``torch.autograd.backward`` runs in autograd's
    device thread, while the training thread is inside its pass: it is part of that pass, and
    no listener may run there (it would read gradients autograd is writing). That device
    thread needs a GPU; a thread started by ``_thread.start_new_thread`` stands in for it
    here, as Python did not start it through ``threading`` either (``threading`` knows both
    as dummy threads). A ``threading.Thread``'s call at the same moment is its own."""
    import _thread

    from sentinel.instrument import losses

    losses.install()
    calls: list[str] = []

    class Listener:
        stepped_in = None  # any thread's backward() concerns it

        def before_backward(self, root: Any) -> None:
            calls.append(threading.current_thread().__class__.__name__)

    listener = Listener()
    began, released = threading.Event(), threading.Event()
    done: list[bool] = []

    def other(how: str) -> None:
        try:
            assert began.wait(30)
            x = torch.ones(3, requires_grad=True)
            torch.autograd.backward((2 * x).sum())
            done.append(x.grad is not None and bool((x.grad == 2).all()))
        finally:
            if how == "dummy":
                released.set()

    x = torch.ones(3, requires_grad=True)
    loss = _Gate.apply(x * 3, began, released).sum()
    losses.backward_listeners.add(listener)
    try:
        _thread.start_new_thread(other, ("dummy",))
        loss.backward()
        assert calls == ["_MainThread"] and done == [True]

        began.clear()
        released.clear()
        loss = _Gate.apply(x * 3, began, released).sum()
        t = threading.Thread(target=lambda: (other("thread"), released.set()))
        t.start()
        loss.backward()
        t.join(30)
        assert calls == ["_MainThread", "_MainThread", "Thread"] and done == [True, True]
    finally:
        losses.backward_listeners.discard(listener)
