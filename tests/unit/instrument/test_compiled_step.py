"""A training step compiled whole, ``backward()`` inside (Keras's ``jit_compile=True`` on
the torch backend compiles its train step so; so do scripts that compile their step
function): dynamo breaks the graph at ``backward()``, with or without Sentinel. It traced
Sentinel's wrapper of ``backward()`` instead, and the thread-local count in it was a guard
that changed at every step: the step was compiled again at each call until dynamo gave up
(8 times), and the compiled Keras run's losses differed in their 6th digit."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.helpers import MLP, make_monitor


def test_a_compiled_step_with_backward_inside_is_compiled_once(tmp_path: Any) -> None:
    torch._dynamo.reset()
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(len(gm.graph.nodes))  # one call per graph compiled
        return gm.forward

    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt, capture_loss=True)

    @torch.compile(backend=backend)
    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    gen = torch.Generator().manual_seed(0)
    losses = []
    try:
        for _ in range(12):
            x = torch.randn(8, 16, generator=gen)
            loss = train_step(x, x.sum(1, keepdim=True))
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    finally:
        mon.close()
        torch._dynamo.reset()
    assert len(graphs) <= 2, graphs  # the forward's graph, and what follows the break (nothing here)
    steps = sender.steps()
    assert [f["step"] for f in steps] == list(range(1, 13))
    assert [f["scalars"]["loss"] for f in steps] == losses  # each backward()'s loss, taken eagerly
