"""Keras 3 on the torch backend (``scripts/keras_fit.py``: keras.io's MNIST convnet shape,
``fit()`` with Keras's own Adam): run plainly, under ``sentinel run``, and under ``sentinel
run`` with the script's own ``sentinel.watch(model)``. Keras steps its variables with no
``torch.optim.Optimizer``, so each is watched as parameters updated by hand are: a step per
``backward()``. Before, the one line said the parameters were "updated by hand", every layer
was one group (``_functional._torch_params``), and ``watch(model)`` raised a ``TypeError``."""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).parent / "scripts" / "keras_fit.py"


def _run(tmp_path: Path, name: str, *, sentinel: bool, watch: bool = False) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / name
    out.mkdir()
    env = {**os.environ, "XDG_STATE_HOME": str(out / "state"), "KERAS_WATCH": "1" if watch else "0"}
    cmd = [sys.executable, str(SCRIPT), str(out)]
    if sentinel:
        cmd = [sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env), out


@pytest.mark.slow  # 25-47 s: behind the marker, to keep `make test` well under its 20 minutes
def test_a_keras_fit_is_watched_by_layer_and_left_as_it_was(tmp_path: Path) -> None:
    plain, _ = _run(tmp_path, "plain", sentinel=False)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[-1] == "loaded True"
    rows = [ln.split()[1:] for ln in plain.stdout.splitlines() if ln.startswith("batch ")]
    assert len(rows) == 21  # 3 epochs of 7 batches
    for name, watch in (("zero_code", False), ("watched", True)):
        proc, out = _run(tmp_path, name, sentinel=True, watch=watch)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == plain.stdout, name  # the script's numbers, its evaluation, its saved model
        assert "Traceback" not in proc.stderr
        said = [ln for ln in proc.stderr.splitlines() if "torch.optim.Optimizer" in ln]
        if watch:  # the script asked for it: no line
            assert said == [], proc.stderr
        else:
            assert len(said) == 1 and said[0].startswith(
                "sentinel: the parameters are stepped by keras.src.backend.torch.optimizers.torch_adam.Adam, which is "
                "no torch.optim.Optimizer"), proc.stderr
            assert "from backward() 1 on" in said[0] and "by hand" not in said[0]
        db = sqlite3.connect(out / "state" / "sentinel" / "history.sqlite")
        [(run_id, steps, groups)] = db.execute("SELECT id, steps, groups FROM runs").fetchall()  # one run
        assert (steps, groups) == (21, '["sequential/conv2d", "sequential/dense"]'), name
        samples = db.execute("SELECT step, loss, grad_norm FROM samples WHERE run_id = ? ORDER BY step",
                             (run_id,)).fetchall()
        assert [s for s, _, _ in samples] == list(range(1, 22))
        for (_, loss, norm), (ref_loss, ref_norm) in zip(samples, rows):
            # the batch's loss undone from Keras's running mean, printed to 6 places
            assert loss == pytest.approx(float(ref_loss), abs=1e-4), name
            assert norm == pytest.approx(float(ref_norm), abs=2e-6), name
        assert all(math.isfinite(n) for _, _, n in samples)
