"""History cost: per frame on the engine's thread and the writer's, and the file's size.

Prints a table; asserts nothing. Frames are step frames of a 64-group run as the
instrument sends them (grad sums every step, parameter and update sums and memory every
10 steps, the loss, the learning rate).

    .venv/bin/python benchmarks/history.py [--steps 100000] [--groups 64]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import tempfile
import time
from typing import Any

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.history.recorder import Recorder


def frames(steps: int, groups: int, run: str = "bench", start: int = 1) -> Any:
    names = [f"layers.{i}" for i in range(groups)]
    rnd = random.Random(0)
    for step in range(start, start + steps):
        f: dict[str, Any] = {"kind": "step", "job": "bench", "run": run, "rank": 0, "world": 1, "step": step,
                             "t": 1.7e9 + step * 0.1, "groups": names, "lr": [3e-4], "step_seconds": 0.1,
                             "grad_sumsq": [rnd.random() for _ in range(groups)], "shard": "replicated",
                             "scalars": {"loss": 2.0 / math.sqrt(step) + rnd.random() * 0.01}}
        if step % 10 == 0:
            f["param_sumsq"] = [100 + rnd.random() for _ in range(groups)]
            f["delta_sumsq"] = [1e-4 * rnd.random() for _ in range(groups)]
            f["mem"] = {"host_rss": 3e8 + step}
        yield f


def run_recorder(path: str, steps: int, groups: int, max_points: int) -> tuple[float, float, int]:
    """(µs per frame to offer, µs per frame for the writer, file bytes)."""
    rec = Recorder(path, max_points=max_points, queue_size=steps + 10)
    batch = list(frames(min(steps, 20_000), groups))
    offered = writer_s = 0.0
    done = 0
    while done < steps:
        n = min(len(batch), steps - done)
        chunk = [dict(f, step=f["step"] + done, t=f["t"] + done) for f in batch[:n]]
        t0 = time.perf_counter()
        for f in chunk:
            rec.offer_frame(f)
        t1 = time.perf_counter()
        rec.flush(600)
        writer_s += time.perf_counter() - t1
        offered += t1 - t0
        done += n
    rec.close()
    size = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
    return offered / steps * 1e6, writer_s / steps * 1e6, size


def engine_cost(steps: int, groups: int, history: str | None) -> float:
    """µs per frame for Engine.feed (decode, ingest, rules), with the recorder's queue or without."""
    eng = Engine()
    rec = Recorder(history, queue_size=steps + 10) if history else None
    if rec is not None:
        eng.frame_listeners.append(rec.offer_frame)
    data = [wire.encode(f) for f in frames(steps, groups, run="feed")]
    t0 = time.perf_counter()
    for d in data:
        eng.feed(d)
    dt = time.perf_counter() - t0
    if rec is not None:
        rec.close(600)
    return dt / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--million", action="store_true", help="also a 1M-step run at the default bound")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for label, points in (("default bound (max_points 4096)", 4096), ("unthinned (every step kept)", 10**6)):
            offer, writer, size = run_recorder(os.path.join(tmp, f"{points}.sqlite"), a.steps, a.groups, points)
            rows.append((label, offer, writer, size))
        if a.million:
            offer, writer, size = run_recorder(os.path.join(tmp, "m.sqlite"), 1_000_000, a.groups, 4096)
            rows.append(("1M steps, default bound", offer, writer, size))
        n = min(a.steps, 20_000)
        base = engine_cost(n, a.groups, None)
        with_h = engine_cost(n, a.groups, os.path.join(tmp, "feed.sqlite"))
    print(f"history at {a.groups} groups, {a.steps:,} steps")
    print(f"{'case':<34} {'offer µs/frame':>15} {'writer µs/frame':>16} {'file MiB':>9}")
    for label, offer, writer, size in rows:
        print(f"{label:<34} {offer:>15.2f} {writer:>16.1f} {size / 2**20:>9.2f}")
    print(f"Engine.feed µs/frame: {base:.1f} without history, {with_h:.1f} with (ratio {with_h / base:.3f})")


if __name__ == "__main__":
    main()
