"""The built wheel carries the launcher shim, the rule pack and every module of every subpackage."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # builds a wheel: make test-slow
def test_wheel_contains_the_shim_and_the_rule_pack(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                          "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    [wheel] = tmp_path.glob("sentinel_monitor-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"sentinel_hooks/sitecustomize.py", "sentinel_hooks/__init__.py", "sentinel/py.typed",
            "sentinel/rules/default.yaml", "sentinel/instrument/shim.py"} <= names
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "sentinel").rglob("*.py")}
    assert modules - names == set()  # no module, and so no subpackage, left out
