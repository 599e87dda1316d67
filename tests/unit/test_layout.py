"""The package's imports run one way, downward (docs/architecture.md, "The rooms of the package").

Every ``import`` in the package is read with :mod:`ast`, function-local ones included, so
a lazy import cannot slip past. The rules:

- ``sentinel.instrument`` runs inside training: the standard library, torch, msgpack,
  msgspec, the ground floor's ``wire``, ``errors``, ``listen`` and ``lines``, and itself only. It
  reaches the daemon side (a monitor's own engine, a config file) only through the package
  root (``import sentinel``; ``sentinel._start_engine``), which imports
  ``sentinel.daemon.launch`` when a monitor starts its own engine, never at import
  (``test_never_break`` checks that importing the instrument loads no daemon-side library).
- the ground floor (``wire``, ``store``, ``catalog``, ``errors``, ``listen``, ``lines``) imports nothing
  of the package;
- ``rules`` imports only the ground floor and itself;
- ``engine`` (the pipeline) never imports the shells that carry it or what serves it;
- nothing imports ``sentinel.cli``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sentinel"

THIRD_PARTY_IN_TRAINING = {"torch", "msgpack", "msgspec"}
GROUND_IN_TRAINING = ("sentinel.wire", "sentinel.errors", "sentinel.listen", "sentinel.lines")
SHELLS = ("sentinel.daemon", "sentinel.serve", "sentinel.delivery", "sentinel.history", "sentinel.cli",
          "sentinel.integrations", "sentinel.demo", "sentinel.run")

# (importing package prefix, forbidden import prefixes)
FORBIDDEN: list[tuple[str, tuple[str, ...]]] = [
    ("sentinel.wire", ("sentinel.",)),
    ("sentinel.store", ("sentinel.",)),
    ("sentinel.catalog", ("sentinel.",)),
    ("sentinel.errors", ("sentinel.",)),
    ("sentinel.listen", ("sentinel.",)),
    ("sentinel.files", ("sentinel.",)),
    ("sentinel.lines", ("sentinel.",)),
    ("sentinel.rules", ("sentinel.engine", "sentinel.config", "sentinel.instrument") + SHELLS),
    ("sentinel.engine", ("sentinel.instrument", "sentinel.config") + SHELLS),
    ("sentinel.serve", ("sentinel.engine", "sentinel.instrument", "sentinel.daemon", "sentinel.delivery",
                        "sentinel.cli", "sentinel.demo", "sentinel.run")),
    ("sentinel.delivery", ("sentinel.engine", "sentinel.instrument", "sentinel.daemon", "sentinel.serve",
                           "sentinel.cli", "sentinel.demo", "sentinel.run")),
    # the dashboards generator reads the ground floor and the rule pack (thresholds) only
    ("sentinel.dashboards", ("sentinel.engine", "sentinel.config", "sentinel.instrument") + SHELLS),
    ("sentinel.history", ("sentinel.engine", "sentinel.instrument", "sentinel.config", "sentinel.daemon",
                          "sentinel.serve", "sentinel.delivery", "sentinel.cli", "sentinel.demo", "sentinel.run")),
    ("sentinel.", ("sentinel.cli",)),
]


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, root: Path) -> Iterator[tuple[str, int]]:
    """``(imported module, line)`` for every import in a file, relative ones resolved."""
    mod = module_name(path, root)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "__future__":
                continue
            yield target, node.lineno
            for alias in node.names:  # `from sentinel import wire` imports sentinel.wire
                yield f"{target}.{alias.name}", node.lineno


def _under(name: str, prefix: str) -> bool:
    return name == prefix.rstrip(".") or name.startswith(prefix if prefix.endswith(".") else prefix + ".")


def violations(root: Path) -> list[str]:
    """Every import in the package at ``root`` that breaks the layout, as ``file:line: text``."""
    out: dict[str, str] = {}  # one line per import statement
    for path in sorted(root.rglob("*.py")):
        mod = module_name(path, root)
        own = ".".join(mod.split(".")[:2])  # a subpackage may import itself
        for target, line in imports(path, root):
            where = f"{path.relative_to(root.parent)}:{line}"
            if _under(mod, "sentinel.instrument"):
                top = target.split(".")[0]
                if top == "sentinel":
                    ok = (_under(target, "sentinel.instrument") or target == "sentinel"
                          or any(_under(target, g) for g in GROUND_IN_TRAINING))
                    if not ok:
                        out.setdefault(where, f"{where}: {mod} imports {target} (the instrument imports only "
                                              "itself and the ground floor's wire, errors, listen and lines)")
                elif top not in sys.stdlib_module_names and top not in THIRD_PARTY_IN_TRAINING:
                    out.setdefault(where, f"{where}: {mod} imports {target} (inside training: stdlib, torch, "
                                          "msgpack, msgspec only)")
                continue
            for owner, forbidden in FORBIDDEN:
                if _under(mod, owner) and mod != "sentinel.cli":
                    for bad in forbidden:
                        if _under(target, bad) and not _under(target, own):
                            out.setdefault(where, f"{where}: {mod} imports {target} (imports run downward)")
    return list(out.values())


def test_the_package_imports_run_downward() -> None:
    assert violations(PACKAGE) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "sentinel"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


@pytest.mark.parametrize(("rel", "text", "found"), [
    ("rules/spike.py", "from sentinel.engine.engine import Engine\n", "rules.spike imports sentinel.engine.engine"),
    ("rules/spike.py", "def f():\n    from sentinel.daemon import service\n", "imports sentinel.daemon"),
    ("store.py", "from sentinel.rules.base import median\n", "sentinel.store imports sentinel.rules"),
    ("instrument/stats.py", "import numpy\n", "inside training"),
    ("instrument/stats.py", "from sentinel.serve.exporter import Row\n", "the instrument imports only"),
    ("instrument/stats.py", "from sentinel import config\n", "imports sentinel.config"),
    ("instrument/link.py", "def f():\n    from sentinel.daemon.embedded import EngineThread\n", "imports sentinel.daemon"),
    ("instrument/link.py", "def f():\n    from sentinel.rules.config import ConfigError\n", "imports sentinel.rules"),
    ("errors.py", "from sentinel.rules.config import dotted\n", "sentinel.errors imports sentinel.rules"),
    ("engine/ingest.py", "from ..serve.exporter import Row\n", "imports sentinel.serve.exporter"),
    ("daemon/service.py", "from sentinel.cli import app\n", "imports sentinel.cli"),
    ("dashboards/boards.py", "from sentinel.serve.exporter import Row\n", "imports sentinel.serve.exporter"),
    ("dashboards/boards.py", "from sentinel.daemon import gpu\n", "imports sentinel.daemon"),
    ("history/recorder.py", "from sentinel.engine.engine import Engine\n", "imports sentinel.engine.engine"),
    ("engine/engine.py", "from sentinel.history.recorder import Recorder\n", "imports sentinel.history"),
])
def test_a_forbidden_import_is_found(tmp_path: Path, rel: str, text: str, found: str) -> None:
    root = _tree(tmp_path, {rel: text})
    [v] = violations(root)
    assert found in v and rel in v


@pytest.mark.parametrize(("rel", "text"), [
    ("instrument/stats.py", "import torch\nfrom sentinel import wire\nfrom . import probes\n"),
    ("instrument/link.py", "import sentinel\nfrom sentinel.errors import ConfigError\nfrom sentinel.listen import parse_listen\n"),
    ("engine/ingest.py", "from sentinel.store import Store\nfrom sentinel.rules.base import median\n"),
    ("daemon/service.py", "from sentinel.engine.engine import Engine\nfrom sentinel.serve import http\n"),
    ("cli.py", "from sentinel.daemon.daemon import Daemon\n"),
])
def test_a_downward_import_is_allowed(tmp_path: Path, rel: str, text: str) -> None:
    assert violations(_tree(tmp_path, {rel: text})) == []
