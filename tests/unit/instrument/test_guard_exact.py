"""The step guard's exact skip: a guarded run with a poisoned step k ends bit for bit where a
run that simply did not call step k's ``optimizer.step()`` (nor its scheduler's) ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import sentinel
from tests.helpers import ShardedAdamW

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")

STEPS, K = 14, 9


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)) for _ in range(STEPS)]


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd-fused": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, fused=True),
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adam-single": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "adam-fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adamw-single": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),  # docs/guard.md names it
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-2),
    "lamb": lambda p: pytorch_optimizer.Lamb(p, lr=1e-2),
    "lion": lambda p: pytorch_optimizer.Lion(p, lr=1e-3),
}


def _run(make: Callable[[Any], torch.optim.Optimizer], fault: str | None, guard: dict[str, Any] | None,
         call_step_k: bool = True, scheduler: bool = True) -> tuple[dict[str, torch.Tensor], Any, Any]:
    model = _model()
    opt = make(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5) if scheduler else None
    mon = sentinel.watch(model, opt, engine="off", guard=guard) if guard is not None else None
    for i, (x, y) in enumerate(_batches(), start=1):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if i == K and fault == "nan":
            loss = loss * float("nan")
        elif i == K and fault == "spike":
            loss = loss * 1e4
        loss.backward()
        if i == K and not call_step_k:
            continue
        opt.step()
        if sched is not None:
            sched.step()
    if mon is not None:
        mon.close()
    return {n: p.detach().clone() for n, p in model.state_dict().items()}, opt, mon


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("method", ["auto", "select"])
@pytest.mark.parametrize("fault", ["nan", "spike"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_skipped_step_is_bitwise_the_step_not_taken(name: str, fault: str, method: str) -> None:
    """auto: fused for torch's fused optimizers, else (on the CPU) sync; select: the
    device-side snapshot and select that accelerators take, run here on the CPU."""
    make = OPTIMIZERS[name]
    want, want_opt, _ = _run(make, None, None, call_step_k=False)
    got, got_opt, mon = _run(make, fault, {"warmup": 4, "method": method})
    assert mon.guard.steps == [K]
    expected = "fused" if "fused" in name and method == "auto" else ("sync" if method == "auto" else method)
    assert mon.guard.methods[0] == expected
    assert mon.guard.skipped == {"nonfinite": int(fault == "nan"), "spike": int(fault == "spike")}
    assert _same(got, want)
    ws, gs = want_opt.state_dict(), got_opt.state_dict()
    assert [g["lr"] for g in gs["param_groups"]] == [g["lr"] for g in ws["param_groups"]]
    for pid, st in ws["state"].items():
        for key, v in st.items():
            assert torch.equal(torch.as_tensor(gs["state"][pid][key]), torch.as_tensor(v)), (pid, key)


@pytest.mark.parametrize("name", ["sgd-momentum", "adam-foreach", "lion"])
def test_without_the_guard_the_poison_is_applied(name: str) -> None:
    """The baseline the test above relies on: unguarded, the poisoned step changes the weights."""
    want, _, _ = _run(OPTIMIZERS[name], None, None, call_step_k=False)
    got, _, _ = _run(OPTIMIZERS[name], "spike", None)
    assert not _same(got, want)


@pytest.mark.parametrize("method", ["auto", "select"])
def test_a_skipped_step_of_a_sharded_optimizer_restores_its_local_state(method: str) -> None:
    """A ``ZeroRedundancyOptimizer``-shaped wrapper keeps no state; its local AdamW, stepped
    inside its ``step()``, holds the moments. The guard puts those back too: a NaN step left
    in them would poison every later step."""
    want, want_opt, _ = _run(ShardedAdamW, None, None, call_step_k=False, scheduler=False)
    got, got_opt, mon = _run(ShardedAdamW, "nan", {"warmup": 4, "method": method}, scheduler=False)
    assert mon.guard.steps == [K]
    assert _same(got, want)
    ws, gs = want_opt.optim.state_dict()["state"], got_opt.optim.state_dict()["state"]
    assert ws.keys() == gs.keys() and ws
    for pid, st in ws.items():
        for key, v in st.items():
            assert torch.equal(torch.as_tensor(gs[pid][key]), torch.as_tensor(v)), (pid, key)
