"""``sentinel run -- CMD``: a script with no sentinel import is monitored; exit status passes through."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).parent / "scripts"


LOG: list[str] = []


def _start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    """Start `sentinel run -- args`; returns it and its metrics URL. Its stderr is drained
    into LOG by a thread, so a chatty CMD can never block on a full pipe."""
    proc = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    LOG.clear()
    for line in proc.stderr:  # type: ignore[union-attr]
        LOG.append(line)
        m = re.search(r"metrics at (http://127\.0\.0\.1:\d+)/metrics", line)
        if m:
            threading.Thread(target=lambda: LOG.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("sentinel run printed no metrics address:\n" + "".join(LOG))


def _end(proc: subprocess.Popen[str]) -> None:
    """Stop a `sentinel run` that is still going: SIGTERM reaches CMD through it, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return r.read().decode()


def test_unmodified_script_is_monitored(tmp_path: Path) -> None:
    release = tmp_path / "release"
    proc = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                             sys.executable, str(SCRIPTS / "plain_train.py"), "30", str(release)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:  # type: ignore[union-attr]
            m = re.search(r"metrics at (http://127\.0\.0\.1:\d+)/metrics", line)
            if m:
                url = m.group(1)
                break
        assert url is not None
        assert proc.stdout is not None and proc.stdout.readline().strip() == "trained"
        def stepped() -> str | None:
            text = _metrics(url)
            return text if re.search(r"sentinel_step\{[^}]*\} 30.0", text) else None

        text = wait_for(stepped, what="30 steps on /metrics")
        assert re.search(r'sentinel_step\{job="train",rank="0",run="[^"]+"\} 30.0', text)
        assert "sentinel_loss{" in text and "sentinel_group_grad_norm{group=\"0\"" in text
        release.touch()
        assert proc.wait(60) == 0
    finally:
        _end(proc)


@pytest.mark.parametrize(("code", "expected"), [("raise SystemExit(3)", 3),
                                                ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137)])
def test_exit_status_passes_through(code: str, expected: int) -> None:
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == expected, out.stderr


def test_torchrun_ddp_exports_both_ranks(tmp_path: Path) -> None:
    release = tmp_path / "release"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    proc, url = _start([torchrun, "--standalone", "--nproc-per-node", "2",
                        str(SCRIPTS / "ddp_train.py"), "20", str(release)])
    try:
        def both() -> str | None:
            text = _metrics(url)
            ranks = set(re.findall(r'sentinel_step\{job="train",rank="(\d)",run="[^"]+"\} 20.0', text))
            return text if ranks == {"0", "1"} else None

        text = wait_for(both, timeout=60, what="both ranks at step 20")
        runs = set(re.findall(r'sentinel_step\{job="train",rank="\d",run="([^"]+)"\}', text))
        assert len(runs) == 1, f"ranks must agree on the run name: {runs}"
        # DDP grads are all-reduced: the replicated grad norms of the two ranks agree
        norms = dict(re.findall(r'sentinel_grad_norm\{job="train",rank="(\d)",run="[^"]+"\} (\S+)', text))
        assert float(norms["0"]) == pytest.approx(float(norms["1"]), rel=1e-6)
        release.touch()
        assert proc.wait(60) == 0
    finally:
        _end(proc)
