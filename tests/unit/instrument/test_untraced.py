"""eager_only: a global hook that torch.compile meets inside a compiled function (the
compiling-optimizer recipe's ``opt.step()``) runs eagerly, on the real values, every call."""

from __future__ import annotations

import torch

from sentinel.instrument.untraced import eager_only


def test_a_hook_called_inside_a_compiled_function_runs_eagerly_on_every_call() -> None:
    seen: list[tuple[bool, float]] = []

    @eager_only
    def hook(t: torch.Tensor) -> None:
        seen.append((torch.compiler.is_compiling(), float(t.sum())))  # .item() of a traced tensor would fail

    @torch.compile(backend="eager", fullgraph=False)
    def step(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        hook(y)
        return y + 1

    outs = [step(torch.full((3,), float(i))) for i in range(3)]
    assert [o.tolist() for o in outs] == [[1.0] * 3, [3.0] * 3, [5.0] * 3]
    assert seen == [(False, 0.0), (False, 6.0), (False, 12.0)]  # each call, eagerly, with its own values


def test_outside_compiled_code_the_hook_is_the_function_itself() -> None:
    calls = []

    @eager_only
    def hook(a: int, b: int = 0) -> int:
        calls.append((a, b))
        return a + b

    assert hook(2, b=3) == 5 and calls == [(2, 3)]
    assert hook.__name__ == "hook" and hook.__code__.co_name == "hook"
