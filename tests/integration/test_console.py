"""Alerts on the console: each warning and critical transition is one line on stderr, in
every engine mode (README, "Alerts go to the console"; docs/alerting.md); info advice only
with ``sentinel -v``; a clean run prints nothing but the address line."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import Receiver, end_process, write_config
from tests.integration.test_prometheus import _free_port

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).parent / "scripts" / "console_train.py"
NONFINITE = "sentinel: [FIRING] critical TrainingNonFinite — run "


def _run(*script_args: str, verbose: bool = False, config: str = "") -> subprocess.CompletedProcess[str]:
    """``sentinel [-v] run [--config CONFIG] -- python console_train.py run ARGS``."""
    return subprocess.run([sys.executable, "-m", "sentinel.cli", *(["-v"] if verbose else []), "run",
                           *(["--config", config] if config else []),
                           "--listen", "127.0.0.1:0", "--", sys.executable, str(SCRIPT), "run", *script_args],
                          capture_output=True, text=True, timeout=180)


def _watch(*script_args: str) -> subprocess.CompletedProcess[str]:
    """``python console_train.py watch ARGS``: ``sentinel.watch`` with its own engine process."""
    return subprocess.run([sys.executable, str(SCRIPT), "watch", *script_args],
                          capture_output=True, text=True, timeout=180)


def _sentinel_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("sentinel: ")]


def test_a_nan_loss_under_sentinel_run_is_one_line_on_stderr() -> None:
    out = _run("TrainingNonFinite")
    assert out.returncode == 0 and "fired TrainingNonFinite" in out.stdout, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith(NONFINITE)]
    assert len(lines) == 1, out.stderr
    assert ", since step " in lines[0] and "non-finite" in lines[0].lower(), lines[0]


def test_a_nan_loss_under_watch_is_one_line_on_the_scripts_stderr() -> None:
    out = _watch("TrainingNonFinite")
    assert out.returncode == 0 and "fired TrainingNonFinite" in out.stdout, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith(NONFINITE)]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(NONFINITE + "console, since step "), lines[0]


@pytest.mark.parametrize("how", ["run", "watch"])
def test_info_advice_prints_nothing(how: str) -> None:
    out = _run("AdamWWithoutWeightDecay") if how == "run" else _watch("AdamWWithoutWeightDecay")
    assert out.returncode == 0 and "fired AdamWWithoutWeightDecay" in out.stdout, out.stderr
    assert "AdamWWithoutWeightDecay" not in out.stderr, out.stderr
    assert [line for line in _sentinel_lines(out.stderr) if "metrics at" not in line] == [], out.stderr


def test_info_advice_is_in_the_log_with_verbose() -> None:
    out = _run("AdamWWithoutWeightDecay", verbose=True)
    assert out.returncode == 0 and "fired AdamWWithoutWeightDecay" in out.stdout, out.stderr
    logged = [line for line in out.stderr.splitlines() if "[FIRING] info AdamWWithoutWeightDecay" in line]
    assert len(logged) == 1 and logged[0].startswith("sentinel: [FIRING] info AdamWWithoutWeightDecay — "), out.stderr


def test_a_clean_run_prints_only_the_address() -> None:
    out = _run("none")
    assert out.returncode == 0, out.stderr
    assert _sentinel_lines(out.stderr) == [line for line in out.stderr.splitlines() if line.strip()], out.stderr
    assert len(_sentinel_lines(out.stderr)) == 1 and "metrics at http://127.0.0.1:" in out.stderr, out.stderr


def test_a_node_daemon_writes_the_alert_on_its_own_stderr(tmp_path: Path) -> None:
    """`sentinel daemon` (systemd, the batch script, a sidecar): the alert of a job attached
    to it is a line in the daemon's log (its stderr: the journal, the job's log file)."""
    sock = tmp_path / "node" / "engine.sock"
    daemon = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "daemon", "--listen", "127.0.0.1:0",
                               "--socket", str(sock)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = daemon.stdout.readline()  # type: ignore[union-attr]
        # sentinel daemon: export SENTINEL_SOCKET=PATH SENTINEL_URL=URL, as an operator exports it
        exported = dict(word.split("=", 1) for word in line.split() if word.startswith("SENTINEL_"))
        assert exported.keys() == {"SENTINEL_SOCKET", "SENTINEL_URL"}, line
        out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--", sys.executable, str(SCRIPT), "run",
                              "TrainingNonFinite"], capture_output=True, text=True, timeout=180,
                             env={**os.environ, **exported})
        assert out.returncode == 0 and "fired TrainingNonFinite" in out.stdout, out.stderr
    finally:
        end_process(daemon)  # type: ignore[arg-type]
    err = daemon.stderr.read()  # type: ignore[union-attr]
    assert len([line for line in err.splitlines() if line.startswith(NONFINITE)]) == 1, err


def test_a_route_down_under_sentinel_run_is_told_in_sentinel_lines_and_what_is_left_goes_out_next_run(
        tmp_path: Path) -> None:
    """The chat service is down for a whole run: every line Sentinel adds to the script's
    stderr starts with ``sentinel:`` (its delivery retries and apprise's own complaint
    included, with no time stamp), and its last line says how many notifications it leaves
    undelivered and where they wait; the next run with that outbox delivers them."""
    port = _free_port()  # closed again: nothing listens there
    outbox = tmp_path / "outbox.sqlite"
    cfg = write_config(tmp_path, notify={"urls": [f"json://127.0.0.1:{port}/"], "rate_limit_seconds": 0},
                       outbox={"path": str(outbox), "retry_initial_seconds": 0.3})
    out = _run("TrainingNonFinite", config=cfg)
    assert out.returncode == 0 and "fired TrainingNonFinite" in out.stdout, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines and all(line.startswith("sentinel: ") for line in lines), out.stderr
    assert any(line.startswith("sentinel: notify: delivery on route 0 ") and " failed (attempt " in line
               for line in lines), out.stderr
    with sqlite3.connect(outbox) as db:
        pending = db.execute("SELECT COUNT(*) FROM outbox WHERE state='pending'").fetchone()[0]
    assert pending >= 1, out.stderr  # the firing TrainingNonFinite at least
    assert lines[-1] == (f"sentinel: notify: {pending} notification{'s' if pending > 1 else ''} not delivered; "
                         f"kept in {outbox}, they go out when Sentinel next runs with this outbox and the "
                         "same routes"), out.stderr

    receiver = Receiver(port=port)  # the chat service is back
    try:
        again = _run("none", config=cfg)
        assert again.returncode == 0, again.stderr
        firing = [b for b in receiver.bodies if "[FIRING] critical TrainingNonFinite" in b.get("title", "")]
        assert len(firing) == 1, receiver.bodies
        assert "not delivered" not in again.stderr, again.stderr
    finally:
        receiver.close()
    with sqlite3.connect(outbox) as db:
        assert db.execute("SELECT COUNT(*) FROM outbox WHERE state='pending'").fetchone()[0] == 0
