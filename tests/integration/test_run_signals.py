"""``sentinel run`` hands the signals that stop or checkpoint a job on to its command, once.

A script that saves a checkpoint on SIGUSR1 (Lightning's Slurm auto-requeue, submitit's
SIGUSR2), stops cleanly on SIGTERM or SIGHUP, or saves in ``except KeyboardInterrupt:``
(pytorch/examples' word_language_model) must behave the same wrapped: the signal sent to
``sentinel run`` (an operator's ``kill``, Kubernetes, a batch script's ``trap``) reaches it,
and one a terminal sends to its whole foreground group (Ctrl-C) is not sent a second time.
Slurm's own delivery is tested in test_slurm.py.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import Receiver, wait_for, write_config

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).parent / "scripts" / "signal_train.py"
RUN = [sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--"]


def _signals(folder: Path) -> list[str]:
    path = folder / "signals"
    return path.read_text().split() if path.exists() else []


def _kill_group(pgid: int) -> None:
    """What a test started in its own session, the command included, even when `sentinel run`
    died first and left it running."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _signal(folder: Path, sent: list[signal.Signals], then_stop: bool, launcher: tuple[str, ...] = ()) -> str:
    """Run the script under `sentinel run` in a session of its own (no terminal, as under `kill`
    or Kubernetes), send it ``sent`` once it trains, wait for its handler's note and, with
    ``then_stop``, check that it trains on and stop it with SIGTERM. Returns its stderr, once
    it exited 0."""
    out, err = folder / "out", folder / "err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen([*launcher, *RUN, sys.executable, str(SCRIPT), str(folder)], stdout=o, stderr=e,
                                start_new_session=True)
    try:
        wait_for(lambda: "ready" in out.read_text(), timeout=120, what="training\n" + err.read_text())
        for sig in sent:
            proc.send_signal(sig)
        wait_for(lambda: _signals(folder), timeout=30, what="the script's handler\n" + err.read_text())
        if then_stop:  # the checkpoint was taken and training goes on
            assert proc.poll() is None, err.read_text()
            proc.send_signal(signal.SIGTERM)
        status = proc.wait(60)
    finally:
        _kill_group(proc.pid)
    assert status == 0, err.read_text()
    assert out.read_text().splitlines()[-1] == "done"
    return err.read_text()


@pytest.mark.parametrize(("first", "expected"), [
    (signal.SIGUSR1, ["SIGUSR1", "SIGTERM"]),  # checkpoint, train on; then stopped
    (signal.SIGUSR2, ["SIGUSR2", "SIGTERM"]),
    (signal.SIGHUP, ["SIGHUP"]),
    (signal.SIGQUIT, ["SIGQUIT"]),
    (signal.SIGTERM, ["SIGTERM"]),
    (signal.SIGINT, ["SIGINT"]),
])
def test_a_signal_sent_to_sentinel_run_reaches_the_script_once(
        tmp_path: Path, first: signal.Signals, expected: list[str]) -> None:
    err = _signal(tmp_path, [first], then_stop=len(expected) > 1)
    assert _signals(tmp_path) == expected
    assert torch.load(tmp_path / "model.pt", weights_only=True).keys() == {"0.weight", "0.bias", "2.weight", "2.bias"}
    if first in (signal.SIGUSR1, signal.SIGUSR2):
        assert torch.load(tmp_path / "ckpt.pt", weights_only=True).keys() == {"model", "opt"}
    assert "Traceback" not in err


def _read_until(fd: int, seen: bytearray, text: bytes, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while text not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the terminal's last process closed it
                return text in seen
            if not chunk:
                break
            seen += chunk
    return text in seen


def test_ctrl_c_in_a_terminal_reaches_the_script_once(tmp_path: Path) -> None:
    """The terminal sends SIGINT to its foreground group, the script with it: a second one from
    `sentinel run` would land in the script's `except KeyboardInterrupt:` clean-up."""
    pid, fd = pty.fork()  # `sentinel run` leads a session whose controlling terminal is this pty
    if pid == 0:
        os.execv(sys.executable, [*RUN, sys.executable, str(SCRIPT), str(tmp_path)])
    seen = bytearray()
    try:
        assert _read_until(fd, seen, b"ready", 120), seen.decode(errors="replace")
        os.write(fd, b"\x03")  # Ctrl-C
        assert _read_until(fd, seen, b"done", 60), seen.decode(errors="replace")
        _, wait_status = os.waitpid(pid, 0)
    finally:
        _kill_group(pid)
        os.close(fd)
    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(wait_status) == 0, text
    assert _signals(tmp_path) == ["SIGINT"]
    assert "Exiting from training early" in text and "Traceback" not in text


def test_under_nohup_a_hangup_stays_ignored(tmp_path: Path) -> None:
    """`nohup sentinel run -- CMD`: the hangup nohup told CMD to ignore is not handed to it,
    while the other signals still are (sent in order: once the checkpoint is noted, the
    hangup was seen)."""
    _signal(tmp_path, [signal.SIGHUP, signal.SIGUSR1], then_stop=True, launcher=("nohup",))
    assert _signals(tmp_path) == ["SIGUSR1", "SIGTERM"]


_CRASH = """
import torch
from torch import nn
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)  # small steps: the crash is the one notice
for _ in range(5):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
raise SystemExit(3)
"""


def test_a_stop_signal_after_the_script_ended_does_not_cut_its_crash_report_short(tmp_path: Path) -> None:
    """Slurm sends its time limit's SIGTERM twice, milliseconds apart, and a scheduler sends
    SIGTERM to the whole job, `sentinel run` included, while it reports its command's end. A
    stop signal then is held off until the crash is recorded and delivered: `sentinel run`
    exits with the command's status, and the on-call hears of the crash (the receiver holds
    the delivery open while the signal lands)."""
    receiver = Receiver()
    receiver.hold, receiver.hold_on = 2.0, "TrainingCrashed"
    config = write_config(tmp_path, notify={"urls": [receiver.url], "min_severity": "critical"})
    err = tmp_path / "err"
    with err.open("w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "run", "--config", config, "--listen",
                                 "127.0.0.1:0", "--", sys.executable, "-c", _CRASH], stderr=e,
                                start_new_session=True)
    try:
        wait_for(lambda: any("TrainingCrashed" in str(b) for b in receiver.bodies), timeout=120,
                 what="the crash notice on its way")
        proc.send_signal(signal.SIGTERM)  # while sentinel run waits for the receiver's answer
        status = proc.wait(60)
    finally:
        _kill_group(proc.pid)
        receiver.close()
    assert status == 3, err.read_text()
    assert "TrainingCrashed" in err.read_text() and "exited with status 3" in err.read_text(), err.read_text()
