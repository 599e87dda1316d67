"""The recorder queues a frame of a rank other than 0 as the few fields the writer reads of it
(:func:`sentinel.history.batch.queued`): the file it writes is the same as from whole frames."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from sentinel.history import db as hdb
from sentinel.history.batch import READ, BatchWriter, queued

GROUPS = ["a", "b", "c"]


class Reads(dict[str, Any]):
    """A frame that notes which of its fields are looked at."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.looked: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.looked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.looked.add(str(key))
        return super().__contains__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.looked.add(key)
        return super().get(key, default)


def frames(seed: int = 0) -> list[dict[str, Any]]:
    """Two runs of 3 ranks: steps, logs, goodbyes (one on an exception), a second optimizer
    stream, guard notes, tags, optimizers, commands and environments, a restart at step 1;
    no world size from rank 0 in the second run."""
    rnd = random.Random(seed)
    out: list[dict[str, Any]] = []
    for run in ("r1", "r2"):
        steps = [*range(1, 30), *range(1, 20)]  # the script started over
        for i, step in enumerate(steps):
            for rank in range(3):
                f: dict[str, Any] = {"kind": "step", "job": "j", "run": run, "rank": rank, "world": 3, "step": step,
                                     "t": 1000.0 + i + rank / 10, "groups": GROUPS, "shard": "replicated",
                                     "grad_sumsq": [rnd.random() for _ in GROUPS], "lr": [1e-3],
                                     "scalars": {"loss": 3.0 / step + rnd.random()}, "step_seconds": 0.1}
                if step % 5 == 0:
                    f |= {"param_sumsq": [1.0 + rnd.random() for _ in GROUPS], "mem": {"host_rss": 1e8},
                          "delta_sumsq": [1e-4 for _ in GROUPS]}
                if rnd.random() < 0.1:
                    f["guard"] = {"skipped": True, "reason": "nonfinite", "norm": 1.0, "bound": 2.0}
                if rnd.random() < 0.05:
                    f["tags"] = {"lr": "1e-3"}
                if step == 1 and (run == "r1") == (rank == 0):  # in r2, from ranks 1 and 2 only
                    f |= {"optim": {"class": "AdamW", "dtype": "float32", "hp": {"lr": 1e-3}},
                          "cmd": "python train.py", "env": {"torch": "2.4"}}
                if rnd.random() < 0.1:
                    f["opt"] = "1"
                if run == "r2" and rank == 0:
                    del f["world"]
                out.append(f)
                if rnd.random() < 0.1:
                    out.append({k: f[k] for k in ("job", "run", "rank", "step", "t")}
                               | {"kind": "log", "scalars": {"loss": 1.0}})
        for rank in range(3):
            bye = {"kind": "bye", "job": "j", "run": run, "rank": rank, "world": 3, "step": 19, "t": 2000.0}
            # rank 2's, as `sentinel run` attached to a node's daemon sends it: the command's status;
            # in r2, rank 1's training thread failed, its process going on
            out.append(bye | {"exc": "python (pid 7)", "status": 3} if rank == 2 else
                       bye | {"exc": "RuntimeError at train.py:9", "thread": "trainer"} if (run, rank) == ("r2", 1)
                       else bye)
    return out


def written(path: Path, items: list[dict[str, Any]]) -> dict[str, list[str]]:
    db = hdb.connect(path)
    writer = BatchWriter(16, "host")  # a small max_points: the run is thinned too
    for i in range(0, len(items), 50):
        db.execute("BEGIN IMMEDIATE")
        writer.write(db, [("frame", f) for f in items[i:i + 50]])
        db.execute("COMMIT")
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    out = {t: sorted(map(repr, db.execute(f"SELECT * FROM {t}"))) for t in tables}
    db.close()
    return out


def test_the_writer_reads_only_the_queued_fields_of_a_rank_other_than_0(tmp_path: Path) -> None:
    items = [Reads(f) for f in frames()]
    written(tmp_path / "h.sqlite", items)
    assert all(f.looked <= set(READ) for f in items if f["rank"] != 0)
    assert {k for f in items if f["rank"] != 0 for k in f.looked} == set(READ)


def test_queued_frames_write_the_same_file_as_whole_frames(tmp_path: Path) -> None:
    items = frames()
    whole = written(tmp_path / "whole.sqlite", items)
    assert whole["samples"] and whole["stream_samples"] and whole["skips"] and len(whole["runs"]) == 4
    assert written(tmp_path / "queued.sqlite", [queued(f) for f in items]) == whole


def test_rank_0_is_queued_whole_and_the_others_without_their_values() -> None:
    f0, f1 = (next(f for f in frames() if f["rank"] == rank and "cmd" in f) for rank in (0, 1))
    assert queued(f0) is f0
    q = queued(f1)
    assert q == {k: v for k, v in f1.items() if k in READ} and "grad_sumsq" not in q and "cmd" in q


def test_the_queued_fields_are_fields_of_the_wire_frame() -> None:
    from sentinel import wire

    assert set(READ) <= set(wire.Frame.__struct_fields__)  # one definition: a misspelt key reads nothing
