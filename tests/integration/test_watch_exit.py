"""How a script that calls ``sentinel.watch`` (no ``sentinel run``) ends, as its own engine
(a child process) records it: ``os._exit`` runs no ``atexit``, and a SIGKILL runs nothing.

Before, both left the run ``running`` in the history for good, and a SIGKILL (the OOM
killer's) paged nothing: the engine process ended with its pipe."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import write_config

pytestmark = pytest.mark.integration

SCRIPT = """
import multiprocessing as mp, os, signal, sys, torch, sentinel
from torch import nn

def worker():
    os._exit(0)  # a forked worker's own way out: the parent's monitors stay open

if __name__ == "__main__":
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = sentinel.watch(model, opt, run="exp", config=sys.argv[2])
    for i in range(20):
        if i == 10:
            p = mp.get_context("fork").Process(target=worker)
            p.start()
            p.join()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step(); mon.log(loss=loss)
    print("trained", flush=True)
    how = sys.argv[1]
    if how == "kill":  # once the engine has the last report
        sys.path.insert(0, sys.argv[3])
        from engine_has import wait_for_step
        wait_for_step(mon.url, 20)
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(int(how))
"""


@pytest.mark.parametrize(("how", "status", "state"), [("0", 0, "finished"), ("3", 3, "crashed"),
                                                      ("kill", -9, "crashed")])
def test_a_watched_script_that_ends_without_atexit_is_recorded_as_it_ended(how: str, status: int, state: str,
                                                                            tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05})
    scripts = Path(__file__).parent / "scripts"
    out = subprocess.run([sys.executable, str(script), how, cfg, str(scripts)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == status, out.stderr
    assert out.stdout == "trained\n"
    with sqlite3.connect(history) as db:
        runs = db.execute("SELECT run, steps, state FROM runs").fetchall()
    assert runs == [("exp", 20, state)], (runs, out.stderr)
    crashed = [line for line in out.stderr.splitlines() if "TrainingCrashed" in line]
    if how == "0":
        assert crashed == [], out.stderr
    elif how == "3":
        assert "exited with status 3; SystemExit(3) at train.py:" in crashed[0], crashed
    else:
        assert "its process is gone without finishing (exit status unknown)" in crashed[0], crashed
        assert "killed (the OOM killer's SIGKILL: check dmesg)" in crashed[0]
        assert "last values (step 20" in crashed[0]
