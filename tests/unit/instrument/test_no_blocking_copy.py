"""No code of the training process builds a tensor from host values straight onto a device.

``torch.tensor(values, device=d)`` (and ``as_tensor``, ``full``/``zeros`` are fine: they
copy nothing) copies from the host and makes the host wait for the copy: on CUDA, a sync
inside a hook. The GPU tests (tests/gpu, run only where a GPU is lent) caught one on an
H200; this test keeps the pattern out of ``sentinel/instrument`` on every machine. Such
values go through :func:`sentinel.instrument.stats.device_index` (built on the host, the
copy queued with ``non_blocking=True``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import sentinel.instrument

FOLDER = Path(sentinel.instrument.__file__).parent


def _blocking_builds(source: str) -> list[int]:
    """Lines of ``torch.tensor(...)``/``torch.as_tensor(...)`` calls given a ``device=``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        f = node.func
        if f.attr in ("tensor", "as_tensor") and isinstance(f.value, ast.Name) and f.value.id == "torch":
            device = next((k.value for k in node.keywords if k.arg == "device"), None)
            if device is not None and not (isinstance(device, ast.Constant) and device.value == "cpu"):
                lines.append(node.lineno)
    return lines


def test_the_check_finds_the_pattern() -> None:
    assert _blocking_builds("import torch\nx = torch.tensor([1, 2], device=d)\n") == [2]
    assert _blocking_builds("y = torch.as_tensor(v, dtype=torch.long, device=p.device)\n") == [1]
    assert _blocking_builds("z = torch.tensor([1.0])\nw = torch.tensor([1], device='cpu')\n") == []


def test_no_hook_copies_host_values_to_a_device_and_waits() -> None:
    found = {str(path.relative_to(FOLDER)): lines for path in sorted(FOLDER.glob("*.py"))
             if (lines := _blocking_builds(path.read_text()))}
    assert not found, f"torch.tensor(..., device=...) in sentinel/instrument (use stats.device_index): {found}"
