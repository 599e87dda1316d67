"""On CUDA, the step guard's fused path never synchronises the host with the device: the
verdict is made on the device and reaches torch's fused AdamW as ``found_inf``; the host
reads it back a step later through pinned memory and an event.

Runs only where a GPU is present (``@pytest.mark.gpu``); skipped cleanly otherwise.
"""

from __future__ import annotations

import pytest
import torch

from sentinel.demo.model import TinyGPT, loss_fn, synthetic_batch
from tests.helpers import make_monitor

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _steps(mon, model, opt, batches, poison_at: int = -1, spike_at: int = -1) -> None:  # type: ignore[no-untyped-def]
    for i, (x, y) in enumerate(batches):
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if i == poison_at:
            next(model.parameters()).grad.view(-1)[0].fill_(float("nan"))
        if i == spike_at:
            torch._foreach_mul_([p.grad for p in model.parameters()], 1e4)
        opt.step()
        mon.log(loss=loss)


@pytest.mark.parametrize("fused", [True])
def test_guarded_fused_step_runs_under_sync_debug_mode_error(fused: bool) -> None:
    """The fused path: no sync at all, skipped steps included."""
    torch.manual_seed(0)
    model = TinyGPT(dim=128, depth=4, seq=64).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **({"fused": True} if fused else {"foreach": True}))
    gen = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(gen, 8, 64, 256, "cuda") for _ in range(16)]
    mon, sender = make_monitor(model, opt, guard={"warmup": 3}, update_every=1000, early_steps=0)
    _steps(mon, model, opt, batches[:4])  # lazy state allocation (and the first step's sync method) first
    reference = [p.detach().clone() for p in model.parameters()]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _steps(mon, model, opt, batches[4:12], poison_at=2, spike_at=5)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert mon.errors == 0, mon.boundary.failures  # a sync inside the guard would raise and be counted
    mon.close()
    assert mon.guard.methods[0] == ("fused" if fused else "select")
    assert mon.guard.steps == [7, 10]
    assert mon.guard.skipped == {"nonfinite": 1, "spike": 1}
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(reference, model.parameters()))  # the others applied
    notes = [f["guard"] for f in sender.frames if "guard" in f and f["guard"]["skipped"]]
    assert [n["reason"] for n in notes] == ["nonfinite", "spike"]
