"""A config file that cannot be read as UTF-8 YAML is one ``ConfigError`` line and exit
status 2, never a traceback (item 7 of issue 10)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.config import load_config
from sentinel.rules.config import ConfigError


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sentinel.cli", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.mark.parametrize(("content", "message"), [
    (b"rules:\n  LossSpike: {enabled: false}\n# caf\xe9 in latin-1\n", "not UTF-8 text (byte 42 is 0xe9)"),
    (b"\xff\xfe\x00r\x00u\x00l\x00e\x00s", "not UTF-8 text (byte 0 is 0xff)"),  # UTF-16
])
def test_a_non_utf8_config_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "sentinel.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.problems == [f"{path}: {message}"]
    for command in (["check-config", str(path)], ["daemon", "--config", str(path)],
                    ["run", "--config", str(path), "--", "true"]):
        proc = _cli(*command)
        assert proc.returncode == 2, (command, proc.stderr)
        assert proc.stderr.strip().splitlines() == [f"config error: {path}: {message}"]


def test_an_unreadable_config_is_one_line(tmp_path: Path) -> None:
    proc = _cli("check-config", str(tmp_path))  # a folder: EISDIR
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"config error: {tmp_path}: cannot read: Is a directory"]
    proc = _cli("check-config", str(tmp_path / "missing.yaml"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"config error: {tmp_path / 'missing.yaml'}: cannot read: No such file or directory"]
