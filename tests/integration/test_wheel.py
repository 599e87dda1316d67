"""The built wheel carries the launcher shim, the rule pack and every module of every subpackage."""

from __future__ import annotations

import json
import shutil
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


@pytest.mark.slow  # resolves the package's metadata from a copy of the clone: make test-slow
def test_the_readmes_install_line_takes_the_clone_and_keeps_the_torch_it_finds(tmp_path: Path) -> None:
    """README, "Install": `pip install . "torch==$(python -c '...')"` in a clone's folder, into
    an environment that has torch. A dry run (nothing installed), from a copy of the clone, so
    no build output lands in the working tree."""
    clone = tmp_path / "sentinel"
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "*.egg-info"))
    readme = (ROOT / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("pip install ") and "torch==" in x)
    held = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert line == "pip install . \"torch==$(python -c 'import torch; print(torch.__version__)')\""
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                          ".", f"torch=={held}"], cwd=clone, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    names = {item["metadata"]["name"].lower() for item in json.loads(out.stdout)["install"]}
    assert "sentinel-monitor" in names and "torch" not in names, names
