"""A Python program run by a watched one as a process of its own reports as a run of its own
(``RUN-<name>``); a launcher's ranks (their own ``RANK``), ``multiprocessing``'s spawned
workers and the first program keep the run. Real interpreters, started with the launcher's
shim on ``PYTHONPATH`` as ``sentinel run`` starts them (no torch imported: the shim's part
that runs at start-up)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.instrument.shim import PROGRAM_PID, PROGRAM_RANK

HOOKS = Path(__file__).resolve().parents[3] / "hooks"
# the run's name, and whether the programs it runs would be its own yet (not before it trains)
SHOW = f"import os; print(os.environ['SENTINEL_RUN'], os.environ.get('{PROGRAM_PID}') == str(os.getpid()))"


def _run(tmp_path: Path, args: list[str], **env: str) -> str:
    (tmp_path / "linear_probe.py").write_text(SHOW)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SENTINEL_", "RANK"))}
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**base, "PYTHONPATH": str(HOOKS), "SENTINEL_AUTO": "1", "SENTINEL_RUN": "ssl", **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize(("args", "env", "seen"), [
    (["linear_probe.py"], {}, "ssl False"),  # the first program: the run's own
    (["linear_probe.py"], {PROGRAM_PID: "1", PROGRAM_RANK: ""}, "ssl-linear_probe False"),
    (["-m", "linear_probe"], {PROGRAM_PID: "1", PROGRAM_RANK: ""}, "ssl-linear_probe False"),
    # a rank of a launcher that had none (torchrun's worker), and one run by rank 1
    (["linear_probe.py"], {PROGRAM_PID: "1", PROGRAM_RANK: "", "RANK": "1"}, "ssl False"),
    (["linear_probe.py"], {PROGRAM_PID: "1", PROGRAM_RANK: "1", "RANK": "1"},
     "ssl-linear_probe False"),
    (["-c", SHOW], {PROGRAM_PID: "1", PROGRAM_RANK: ""}, "ssl False"),  # no name to give it
])
def test_a_program_run_by_a_watched_one_is_a_run_of_its_own(tmp_path: Path, args: list[str], env: dict[str, str],
                                                             seen: str) -> None:
    assert _run(tmp_path, args, **env) == seen


def test_a_spawned_multiprocessing_worker_keeps_the_run(tmp_path: Path) -> None:
    code = ("import multiprocessing as mp, os\n"
            "from sentinel.instrument import shim\n"
            f"def show(q): q.put((os.environ['SENTINEL_RUN'], os.environ.get('{PROGRAM_PID}')))\n"
            "if __name__ == '__main__':\n"
            "    shim.watched()  # the parent trains\n"
            "    q = mp.get_context('spawn').Queue(); p = mp.get_context('spawn').Process(target=show, args=(q,))\n"
            "    p.start(); run, pid = q.get(); p.join()\n"
            "    print(run, pid == str(os.getpid()))\n")
    (tmp_path / "spawner.py").write_text(code)
    assert _run(tmp_path, ["spawner.py"]) == "ssl True"  # the worker's: the parent's run and program


def test_only_a_python_that_trains_makes_its_programs_runs_of_their_own(tmp_path: Path) -> None:
    """A launcher that imports torch but trains nothing (``accelerate launch``'s single
    process) starts the training, which keeps the run; a training script's programs run
    after it began training (its linear probe) are runs of their own."""
    (tmp_path / "train.py").write_text(SHOW)
    code = ("import subprocess, sys\n"
            "from sentinel.instrument import shim\n"
            "run = lambda: subprocess.run([sys.executable, 'train.py'], capture_output=True, text=True).stdout.strip()\n"
            "print(run())  # a launcher: nothing trained here yet\n"
            "shim.watched()  # zero-code mode watches a model of this process from its first step\n"
            "print(run())\n")
    (tmp_path / "launch.py").write_text(code)
    assert _run(tmp_path, ["launch.py"]).splitlines() == ["ssl False", "ssl-train False"]
