"""eager_only: a global hook that torch.compile meets inside a compiled function (the
compiling-optimizer recipe's ``opt.step()``) runs eagerly, on the real values, every call."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from sentinel.instrument.untraced import eager_only

ROOT = Path(__file__).resolve().parents[3]


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


def test_many_hooks_in_one_compiled_function_stay_under_dynamos_recompile_limit() -> None:
    """Dynamo keeps at most 8 compiled entries per code object, then writes "hit
    config.recompile_limit" to the script's stderr. Each hook has a code object of its own,
    so ten of them met in one compiled function (Sentinel has four; a shared one reached the
    limit with three) leave stderr clean, and each runs eagerly on every call. (A Python of
    its own: Dynamo's caches and its log handler's stream are per process.)"""
    script = textwrap.dedent("""
        import torch
        from sentinel.instrument.untraced import eager_only

        seen = []

        def make(i):
            def body(t):
                seen.append(i)
            body.__name__ = f"hook{i}"
            return eager_only(body)

        hooks = [make(i) for i in range(10)]

        @torch.compile(backend="eager", fullgraph=False)
        def step(x):
            for h in hooks:
                h(x)
            return x + 1

        for i in range(3):
            step(torch.full((2,), float(i)))
        print(seen == list(range(10)) * 3)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout == "True\n", out.stderr
    assert "recompile_limit" not in out.stderr, out.stderr
