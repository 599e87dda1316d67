"""The command line a run's first report records (the history's "command"): as typed, with
the interpreter; in a spawned worker, the script's, not multiprocessing's bootstrap."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_command_line_is_as_typed_and_a_spawned_workers_is_its_scripts(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp
        from sentinel.instrument.reporter import command_line

        def worker(q):
            q.put(command_line())

        if __name__ == "__main__":
            print(command_line())
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=worker, args=(q,))
            p.start()
            print(q.get(timeout=60))
            p.join()
    """))
    out = subprocess.run([sys.executable, "-W", "ignore", str(script), "--lr", "3e-4"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    main, worker = out.stdout.splitlines()
    assert main == f"{sys.executable} -W ignore {script} --lr 3e-4"
    assert worker == f"{Path(sys.executable).name} {script} --lr 3e-4"


def test_a_resumed_trainings_first_report_records_it_too() -> None:
    """A process that resumes from a checkpoint (its optimizer's count goes on: its first
    step is 4 here) records its command with its first report, as step 1 does: a restarted
    job's attempt (``torchrun --max-restarts``) is a new history row that nothing else names."""
    import torch

    from tests.helpers import MLP, make_monitor

    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 16)).square().mean().backward()
        opt.step()
    state = opt.state_dict()
    resumed = torch.optim.AdamW(model.parameters(), lr=1e-3)
    resumed.load_state_dict(state)
    mon, sender = make_monitor(model, resumed)
    try:
        for _ in range(3):
            resumed.zero_grad()
            loss = model(torch.randn(4, 16)).square().mean()
            loss.backward()
            resumed.step()
            mon.log(loss)
    finally:
        mon.close()
    steps = sender.steps()
    assert [f["step"] for f in steps] == [4, 5, 6]
    assert [("cmd" in f) for f in steps] == [True, False, False]
