"""``examples/optimizer_shootout.py --quick``: seed 004's procedure end to end, in CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.history import db as hdb
from sentinel.history.query import list_runs

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "optimizer_shootout.py"


@pytest.mark.slow  # 18 s of real training: make test-slow
def test_the_quick_shootout_ends_with_the_comparison_table(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_optimizer")
    db = tmp_path / "h.sqlite"
    res = subprocess.run([sys.executable, "-W", "ignore", str(EXAMPLE), "--quick", "--db", str(db)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "comparison (target loss" in res.stdout
    conn = hdb.connect(db, readonly=True)
    main = list_runs(conn, job="shootout", tags={"phase": "main"})
    kept = {r.tags["optimizer"] for r in main}
    assert len(kept) >= 4  # at most two optimizers may fail the warm-up or the sweep on 10 steps
    for name in kept:
        seeds = sorted(r.tags["seed"] for r in main if r.tags["optimizer"] == name)
        assert seeds == ["1", "2", "3"]
    # one row per optimizer, over its three seeds, named by the class its frames carried
    from sentinel.history import compare as cmp

    table = cmp.rows(conn, main)
    for name in kept:
        [row] = [r for r in table if {x.tags["optimizer"] for x in r.runs} == {name}]
        assert len(row.runs) == 3 and row.optimizer.lower().startswith(name.lower()[:3]), (name, row.optimizer)
        assert row.optimizer in res.stdout
    assert all(r.steps == 20 and r.state == "finished" for r in main)
    assert list_runs(conn, job="shootout", tags={"phase": "sweep"})  # the sweep is recorded too
