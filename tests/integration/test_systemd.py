"""deploy/systemd/sentinel@.service: ``systemd-analyze verify`` finds nothing to say about it
(where systemd-analyze is installed; systemd itself is not PID 1 here, so the unit cannot be
started), and its ExecStart, with systemd's specifiers filled in as systemd would, starts a
daemon that answers /healthz and takes frames on the socket folder the unit names."""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import end_process

pytestmark = pytest.mark.integration
UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "sentinel@.service"


def _verify(tmp: Path, text: str, user: str) -> subprocess.CompletedProcess[str]:
    path = tmp / f"sentinel@{user}.service"
    path.write_text(text.replace("/usr/local/bin/sentinel", str(Path(sys.executable).with_name("sentinel"))))
    return subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_has_nothing_to_say(tmp_path: Path) -> None:
    if not Path(sys.executable).with_name("sentinel").exists():
        pytest.skip("no sentinel console script beside this Python (pip install -e .)")
    text = UNIT.read_text()
    assert "ProtectSystem=strict" in text and "RuntimeDirectory=sentinel-%i" in text and "User=%i" in text
    out = _verify(tmp_path, text, getpass.getuser())
    assert out.returncode == 0 and out.stderr.strip() == "", out.stderr
    bad = _verify(tmp_path, text.replace("ProtectSystem=strict", "ProtectSystem=sometimes"), getpass.getuser())
    assert "protect system value" in bad.stderr  # it does read the hardening lines


def test_the_units_command_starts_a_daemon_on_its_runtime_folder(tmp_path: Path) -> None:
    user = getpass.getuser()
    [line] = [ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart=")]
    cmd = line.removeprefix("ExecStart=").replace("%t", str(tmp_path / "run")).replace("%i", user)
    cmd = cmd.replace("${SENTINEL_LISTEN}", "127.0.0.1:0")
    (tmp_path / "run" / f"sentinel-{user}").mkdir(parents=True, mode=0o700)  # RuntimeDirectory=
    args = [sys.executable, "-m", "sentinel.cli", *cmd.split()[1:]]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        m = re.search(r"SENTINEL_SOCKET=(\S+) SENTINEL_URL=(\S+)", proc.stdout.readline())  # type: ignore[union-attr]
        assert m and m.group(1) == str(tmp_path / "run" / f"sentinel-{user}" / "socket" / "engine.sock")
        assert Path(m.group(1)).is_socket() and (Path(m.group(1)).parent.stat().st_mode & 0o777) == 0o700
        with urllib.request.urlopen(m.group(2) + "/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        end_process(proc)  # type: ignore[arg-type]
