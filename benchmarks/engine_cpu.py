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
- ``floor``: the least any Python engine pays per frame before its rules and history, as a
  budget for a redesign: the strict decode (``wire.decode_strict``), the caps
  (:func:`~sentinel.engine.validate.fits`), and the frame's gauges and two 64-group rows
  scattered into column buffers allocated once (numpy rows, one per frame), with the
  norms taken from the sums of squares. No store, no series, no rules: what a columnar
  ingest (docs/performance.md, "What remains") could not go below.
- ``native`` (not run by default): what compiling the engine's hot modules would buy, as
  they are. A copy of the package in a temporary folder has :data:`NATIVE` compiled by
  mypyc (from the dev extra; it needs a C compiler and takes minutes), and the ``cpu``
  part runs in the pure tree and in the copy, alternately, one repeat a child process.
  The detectors' modules are not among them: their pydantic parameter models make
  mypyc 2.4's C fail to compile (``CPyModule_pydantic___main`` undeclared).

The process is pinned to one core, as the daemon's share of a node is one core.

Nothing is asserted.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/engine_cpu.py [--steps 500] [--repeats 5]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/engine_cpu.py --only floor
    PYTHONPATH=$PWD .venv/bin/python benchmarks/engine_cpu.py --only native
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from daemon import PERIOD, Workload, _no_rules, _pin, _through_engine  # noqa: E402  (a sibling script)
from detection import render  # noqa: E402

from sentinel import wire  # noqa: E402
from sentinel.engine.engine import Engine  # noqa: E402
from sentinel.engine.validate import Limits, fits  # noqa: E402
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


PACKS = ("full default", "full default + history", "every rule disabled")
ROOT = Path(__file__).resolve().parents[1]
# the modules the ``native`` part compiles: the store, the ingest and the rules' hot loop
NATIVE = ("sentinel/store.py", "sentinel/engine/engine.py", "sentinel/engine/ingest.py", "sentinel/engine/derived.py",
          "sentinel/engine/crossrank.py", "sentinel/engine/shards.py", "sentinel/engine/clip.py",
          "sentinel/engine/optimizer.py", "sentinel/engine/schedule.py", "sentinel/engine/guard.py",
          "sentinel/engine/magnitude.py", "sentinel/rules/judge.py", "sentinel/rules/evaluator.py",
          "sentinel/rules/lifecycle.py", "sentinel/rules/compiled.py")


def _cpu_runs(warm: list[bytes], timed: list[bytes], repeats: int) -> dict[str, list[float]]:
    packs = {PACKS[0]: (load_pack(), False), PACKS[1]: (load_pack(), True), PACKS[2]: (_no_rules(), False)}
    us: dict[str, list[float]] = {k: [] for k in packs}
    for r in range(repeats):
        for label in (list(packs) if r % 2 == 0 else list(reversed(packs))):
            pack, history = packs[label]
            us[label].append(_feed(warm, timed, pack, history))
    return us


def cpu(warm: list[bytes], timed: list[bytes], repeats: int, markdown: bool) -> None:
    us = _cpu_runs(warm, timed, repeats)
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


def _scatter(timed: list[bytes], decode_only: bool) -> float:
    """Process CPU µs per frame to decode ``timed`` strictly, hold each to the caps and, unless
    ``decode_only``, write its values into column buffers (see the module docstring)."""
    n, limits, unset = len(timed), Limits(), wire.UNSET
    cols, grad, param = np.zeros((n, 12)), np.zeros((n, 64)), np.zeros((n, 64))
    t0 = time.process_time()
    for i, data in enumerate(timed):
        f = wire.decode_strict(data)
        if not fits(f, limits):
            raise AssertionError("the benchmark's frames are whole")
        if decode_only:
            continue
        row = cols[i]
        row[0], row[1] = f.step, f.t
        if f.grad_sumsq is not unset:
            row[2] = math.sqrt(math.fsum(f.grad_sumsq))
            grad[i] = f.grad_sumsq
            np.sqrt(grad[i], out=grad[i])
        if f.param_sumsq is not unset:
            row[3] = math.sqrt(math.fsum(f.param_sumsq))
            param[i] = f.param_sumsq
            np.sqrt(param[i], out=param[i])
        if f.step_seconds is not unset:
            row[4] = f.step_seconds
        if f.busy_seconds is not unset:
            row[5] = f.busy_seconds
        if f.scalars is not unset:
            row[6] = f.scalars.get("loss", math.nan)
        if f.mem is not unset:
            row[7], row[8] = f.mem.get("host_rss", math.nan), f.mem.get("cuda_reserved", math.nan)
        if f.amp is not unset and f.amp.scale is not unset:
            row[9] = f.amp.scale
        if f.lr is not unset and f.lr:
            row[10] = f.lr[0]
        if f.sat is not unset and f.sat[1]:
            row[11] = f.sat[0] / f.sat[1]
    return 1e6 * (time.process_time() - t0) / n


def floor(warm: list[bytes], timed: list[bytes], repeats: int, markdown: bool) -> None:
    res: dict[str, list[float]] = {"decode": [], "scatter": [], "none": []}
    for r in range(repeats):
        for part in list(res) if r % 2 == 0 else list(reversed(res)):
            if part == "none":
                res[part].append(_feed(warm, timed, _no_rules()))
            else:
                res[part].append(_scatter(timed, decode_only=part == "decode"))
    m = {k: statistics.median(v) for k, v in res.items()}
    rows = [["per frame", "CPU µs (median)", "frames/s of one core"],
            ["strict decode and the caps (wire.decode_strict, fits)", f"{m['decode']:.1f}",
             f"{1e6 / m['decode']:,.0f}"],
            ["… and its values scattered into column buffers", f"{m['scatter']:.1f}", f"{1e6 / m['scatter']:,.0f}"],
            ["Engine.feed today, every rule disabled (same run)", f"{m['none']:.1f}", f"{1e6 / m['none']:,.0f}"],
            ["left for rules and history under 20,000 frames/s (50 µs less the scatter)",
             f"{50 - m['scatter']:.1f}", ""]]
    print(render(rows, markdown))


def _compiled_copy(into: Path) -> str | None:
    """The package copied into ``into`` with :data:`NATIVE` compiled there by mypyc; None
    when it cannot be built, with a line saying why."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        return "no C compiler"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "no mypyc (the dev extra's mypy brings it)"
    shutil.copytree(ROOT / "sentinel", into / "sentinel", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", into / "pyproject.toml")  # mypy's settings
    (into / "setup_native.py").write_text(
        "from setuptools import setup\nfrom mypyc.build import mypycify\n"
        f"setup(name='sentinel-native', packages=[], ext_modules=mypycify({list(NATIVE)!r}, "
        "group_name='sentinel._native', opt_level='3'))\n")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "setup_native.py", "build_ext", "--inplace"], cwd=into,
                         capture_output=True, text=True)
    if out.returncode != 0:
        return "mypyc failed: " + (out.stderr or out.stdout).strip().splitlines()[-1][:300]
    print(f"compiled {len(NATIVE)} modules with mypyc in {time.monotonic() - t0:.0f} s", flush=True)
    return None


def native(steps: int, repeats: int, markdown: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        why = _compiled_copy(Path(tmp))
        if why is not None:
            print(f"skipped: {why}")
            return
        trees = {"pure Python": str(ROOT), "mypyc-compiled": tmp}
        us: dict[str, dict[str, list[float]]] = {t: {p: [] for p in PACKS} for t in trees}
        for r in range(repeats):
            for tree in (list(trees) if r % 2 == 0 else list(reversed(trees))):
                env = {**os.environ, "PYTHONPATH": trees[tree]}
                out = subprocess.run([sys.executable, __file__, "--only", "cpu", "--repeats", "1", "--steps",
                                      str(steps), "--json"], env=env, cwd=trees[tree], capture_output=True,
                                     text=True, check=True)
                runs = json.loads(out.stdout.strip().splitlines()[-1])
                store = runs.pop("store")
                assert store.endswith(".so") == (tree == "mypyc-compiled"), (tree, store)  # the tree it meant
                for pack, v in runs.items():
                    us[tree][pack].append(v[0])
    rows = [["pack", *(f"{t} µs/frame" for t in trees), "compiled / pure", "compiled frames/s"]]
    for pack in PACKS:
        pure, comp = (statistics.median(us[t][pack]) for t in trees)
        rows.append([pack, f"{pure:.1f}", f"{comp:.1f}", f"{comp / pure:.2f}", f"{1e6 / comp:,.0f}"])
    print(render(rows, markdown))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=["cpu", "rules", "floor", "native"], default=[],
                    help="parts to run (default: cpu and rules)")
    ap.add_argument("--steps", type=int, default=500, help="timed steps x 8 ranks (default 500)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats (default 5)")
    ap.add_argument("--markdown", action="store_true", help="print tables as markdown")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the cpu part's runs, for `native`
    args = ap.parse_args(argv)
    parts = args.only or ["cpu", "rules"]
    if "native" in parts:
        print(f"python {sys.version.split()[0]}; process CPU time; {args.steps} steps x 8 ranks, {args.repeats} "
              "repeats a tree, alternately", flush=True)
        print("\n== pure Python against the hot modules compiled by mypyc ==\n", flush=True)
        native(args.steps, args.repeats, args.markdown)
        parts = [p for p in parts if p != "native"]
        if not parts:
            return 0
    where = _pin(min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None)
    work = Workload()
    warm = list(work.stream(1, PERIOD))
    timed = list(work.stream(PERIOD + 1, PERIOD + args.steps))
    if args.json:
        import sentinel.store

        runs: dict[str, Any] = _cpu_runs(warm, timed, args.repeats)
        print(json.dumps({**runs, "store": sentinel.store.__file__}))
        return 0
    print(f"python {sys.version.split()[0]}, {where}; {len(timed)} frames of {work.groups} groups from 8 ranks after "
          f"{PERIOD} warm-up steps; process CPU time", flush=True)
    if "cpu" in parts:
        print("\n== CPU per frame through Engine.feed ==\n", flush=True)
        cpu(warm, timed, args.repeats, args.markdown)
    if "rules" in parts:
        print("\n== the rules' share, split ==\n", flush=True)
        rules(warm, timed, args.repeats, args.markdown)
    if "floor" in parts:
        print("\n== the floor: decode and columns, no store, no rules ==\n", flush=True)
        floor(warm, timed, args.repeats, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
