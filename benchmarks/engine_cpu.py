"""The engine's CPU per frame, and what of the rules' share the detectors take.

The frames are ``benchmarks/daemon.py``'s (the reports of a real 64-group model from 8
ranks, recorded once and replayed). Two parts:

- ``cpu``: the process's CPU time per frame through :meth:`Engine.feed` with the full
  default pack, with the full pack and the history recorder attached (its writer thread's
  commits included: it runs in the same process), and with every rule disabled. The three
  run in turn, the order reversed every other repeat; medians. CPU time, unlike the wall
  clock ``daemon.py --only ingest`` reads, leaves out what other processes of a shared
  machine take, so two trees compare on one machine: run this file with ``PYTHONPATH``
  set to each, alternately.
- ``rules``: the rules' share (full pack less no rules) split into the detectors' full
  verdicts (``DetectorSpec.fn``), their shortcuts (``idle``, ``quiet``), and the rest: the
  evaluator's own Python (picking the due rules, their series, the life cycle). The
  detector functions are wrapped with a timer (about 0.2 µs a call of the wrappers' own).

The process is pinned to one core, as the daemon's share of a node is one core.

Nothing is asserted.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/engine_cpu.py [--steps 500] [--repeats 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from daemon import PERIOD, Workload, _no_rules, _pin, _through_engine  # noqa: E402  (a sibling script)
from detection import render  # noqa: E402

from sentinel.engine.engine import Engine  # noqa: E402
from sentinel.rules.config import RulePack, load_pack  # noqa: E402


def _feed(warm: list[bytes], timed: list[bytes], pack: RulePack, history: bool = False,
          timers: dict[str, float] | None = None) -> float:
    """Process CPU µs per frame of ``timed``, after ``warm``; with ``timers``, the step
    rules' detector functions are wrapped to add their time into it."""
    prepare = None if timers is None else (lambda engine: _wrap(engine, timers))
    return 1e6 * _through_engine(warm, timed, pack, history, clock=time.process_time, prepare=prepare) / len(timed)


def _wrap(engine: Engine, timers: dict[str, float]) -> None:
    clock = time.perf_counter

    def timed(fn: Callable[..., Any] | None, key: str) -> Callable[..., Any] | None:
        if fn is None:
            return None

        def call(*args: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args)
            finally:
                timers[key] += clock() - t0
        return call

    for c in engine.rules._step_rules:
        spec = dataclasses.replace(c.spec, fn=timed(c.spec.fn, "detectors"), idle=timed(c.spec.idle, "shortcuts"),
                                   quiet=timed(c.spec.quiet, "shortcuts"))
        object.__setattr__(c, "spec", spec)  # Compiled is frozen: the benchmark's own patch


def cpu(warm: list[bytes], timed: list[bytes], repeats: int, markdown: bool) -> None:
    packs = {"full default": (load_pack(), False), "full default + history": (load_pack(), True),
             "every rule disabled": (_no_rules(), False)}
    us: dict[str, list[float]] = {k: [] for k in packs}
    for r in range(repeats):
        for label in (list(packs) if r % 2 == 0 else list(reversed(packs))):
            pack, history = packs[label]
            us[label].append(_feed(warm, timed, pack, history))
    rows = [["pack", "CPU µs/frame (median)", "frames/s of one core", "runs"]]
    for label, v in us.items():
        med = statistics.median(v)
        rows.append([label, f"{med:.1f}", f"{1e6 / med:,.0f}", ", ".join(f"{x:.1f}" for x in v)])
    print(render(rows, markdown))


def rules(warm: list[bytes], timed: list[bytes], repeats: int, markdown: bool) -> None:
    full, none = load_pack(), _no_rules()
    res: dict[str, list[float]] = {"full": [], "none": [], "detectors": [], "shortcuts": []}
    n = len(timed)
    for r in range(repeats):
        for part in ("full", "none", "split") if r % 2 == 0 else ("split", "none", "full"):
            if part == "split":
                timers = {"detectors": 0.0, "shortcuts": 0.0}
                _feed(warm, timed, full, timers=timers)
                for k, v in timers.items():
                    res[k].append(1e6 * v / n)
            else:
                res[part].append(_feed(warm, timed, full if part == "full" else none))
    m = {k: statistics.median(v) for k, v in res.items()}
    share = m["full"] - m["none"]
    rest = share - m["detectors"] - m["shortcuts"]
    rows = [["part of the rules' share", "µs/frame (median)", "of the rules"],
            ["detectors' full verdicts (DetectorSpec.fn)", f"{m['detectors']:.1f}",
             f"{100 * m['detectors'] / share:.0f}%"],
            ["their shortcuts (idle, quiet)", f"{m['shortcuts']:.1f}", f"{100 * m['shortcuts'] / share:.0f}%"],
            ["the evaluator's own Python (due rules, series, life cycle)", f"{rest:.1f}", f"{100 * rest / share:.0f}%"],
            ["rules in all (full pack less every rule disabled)", f"{share:.1f}", ""]]
    print(render(rows, markdown))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=["cpu", "rules"], default=[], help="parts to run (default: both)")
    ap.add_argument("--steps", type=int, default=500, help="timed steps x 8 ranks (default 500)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats (default 5)")
    ap.add_argument("--markdown", action="store_true", help="print tables as markdown")
    args = ap.parse_args(argv)
    parts = args.only or ["cpu", "rules"]
    where = _pin(min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None)
    work = Workload()
    warm = list(work.stream(1, PERIOD))
    timed = list(work.stream(PERIOD + 1, PERIOD + args.steps))
    print(f"python {sys.version.split()[0]}, {where}; {len(timed)} frames of {work.groups} groups from 8 ranks after "
          f"{PERIOD} warm-up steps; process CPU time", flush=True)
    if "cpu" in parts:
        print("\n== CPU per frame through Engine.feed ==\n", flush=True)
        cpu(warm, timed, args.repeats, args.markdown)
    if "rules" in parts:
        print("\n== the rules' share, split ==\n", flush=True)
        rules(warm, timed, args.repeats, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
