"""What each engine mode costs a tiny model's training step: ``engine="thread"`` (the engine
in the training process), ``"process"`` (a child process), ``"off"`` (statistics only, no
engine) and no sentinel at all.

``thread-each`` is thread mode as it was before its engine ingested frames in batches
(``embedded.BATCH_SECONDS = 0``: the engine thread wakes for every frame).

A 2-layer MLP trains for ``--steps`` steps per block; blocks of the kinds alternate
(the order rotates each repeat, so drift on a shared machine spreads over all of them).
Per kind it prints the median step time, the training process's CPU per step (all its
threads), that CPU by thread (from ``/proc/self/task``: the training thread, the engine
worker, the history writer, the rest), and for the child process its own CPU per step.
Nothing is asserted.

    .venv/bin/python benchmarks/engine_modes.py [--steps 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any

import torch
from torch import nn

import sentinel
from sentinel.daemon import embedded

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(stat_path: str) -> float:
    """utime + stime (seconds) of a /proc stat file; 0 if it is gone."""
    try:
        with open(stat_path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _threads() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by its Python name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        name = names.get(int(tid), "other")
        if name.startswith("Thread-") or name.startswith("ThreadPool"):
            name = "other"
        elif name.startswith("sentinel-http"):
            name = "sentinel-http*"
        out[name] += _cpu_of(f"/proc/self/task/{tid}/stat")
    return out


def _block(kind: str, steps: int, warm: int, history: str, seed: int, batch: float) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    data = [torch.randn(32, 32, generator=gen) for _ in range(16)]
    mon = None
    embedded.BATCH_SECONDS = 0.0 if kind == "thread-each" else batch
    if kind != "none":
        cfg = os.path.join(os.path.dirname(history), "sentinel.yaml")
        with open(cfg, "w") as f:
            f.write(f"history: {{path: {history}}}\n")
        mon = sentinel.watch(model, opt, run=f"modes-{kind}-{seed}", engine=kind.split("-")[0],
                             listen="127.0.0.1:0", config=cfg)
    child = getattr(getattr(mon, "engine", None), "proc", None)
    child_stat = f"/proc/{child.pid}/stat" if child is not None else None
    times: list[float] = []
    t_cpu = c_cpu = 0.0
    threads0: dict[str, float] = {}
    for i in range(steps + warm):
        if i == warm:
            threads0, t_cpu = _threads(), time.process_time()
            c_cpu = _cpu_of(child_stat) if child_stat else 0.0
        t0 = time.perf_counter()
        x = data[i % len(data)]
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if mon is not None:
            mon.log(loss=loss)
        if i >= warm:
            times.append(time.perf_counter() - t0)
    cpu = time.process_time() - t_cpu
    threads1 = _threads()
    child_cpu = (_cpu_of(child_stat) - c_cpu) if child_stat else 0.0
    if mon is not None:
        mon.close()
    by_thread = {n: threads1.get(n, 0.0) - threads0.get(n, 0.0) for n in threads1}
    return {"times": times, "cpu": cpu / steps, "child": child_cpu / steps,
            "threads": {n: v / steps for n, v in by_thread.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kinds", default="none,off,process,thread,thread-each")
    ap.add_argument("--batch", type=float, default=embedded.BATCH_SECONDS,
                    help="thread mode's batch_seconds (default: sentinel's)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    kinds = a.kinds.split(",")
    batch = a.batch
    results: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            for kind in order:
                folder = os.path.join(tmp, f"{kind}-{r}")
                os.makedirs(folder)
                results[kind].append(_block(kind, a.steps, a.warm, os.path.join(folder, "h.sqlite"), r, batch))
    print(f"2-layer MLP, {a.steps} steps per block (+{a.warm} not timed), {a.repeats} repeats, torch threads 1, {os.cpu_count()} CPUs")
    print(f"{'engine':<11} {'step ms: median':>16} {'mean':>6} {'p90':>6} {'process CPU ms/step':>20} "
          f"{'child CPU ms/step':>18}  CPU ms/step by thread")
    for kind in kinds:
        rs = results[kind]
        every = sorted(t for x in rs for t in x["times"])
        med, mean = statistics.median(every) * 1e3, statistics.fmean(every) * 1e3
        p90 = every[int(0.9 * len(every))] * 1e3
        cpu = statistics.median(x["cpu"] for x in rs) * 1e3
        child = statistics.median(x["child"] for x in rs) * 1e3
        names = sorted({n for x in rs for n in x["threads"]})
        parts = ", ".join(f"{n} {statistics.median(x['threads'].get(n, 0.0) for x in rs) * 1e3:.2f}"
                          for n in names)
        print(f"{kind:<11} {med:>16.3f} {mean:>6.3f} {p90:>6.3f} {cpu:>20.3f} {child:>18.3f}  {parts}")


if __name__ == "__main__":
    main()
