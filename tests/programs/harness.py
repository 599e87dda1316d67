"""Runs one zoo program plainly, under ``sentinel run`` and under ``sentinel.watch``, and
collects what the tests compare: exit status, stdout, stderr, the program's reference
values (``ZOO_REF``), the files it saved (digested by ``load_saved.py`` in a Python where
Sentinel cannot be imported, for all programs at once), the history file's rows and, under ``sentinel run``, a
snapshot of ``/metrics`` and ``/api/v1/alerts`` taken as the program exits
(``_probe/sitecustomize.py``).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import GLOO_EXIT_ABORT

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROBE = HERE / "_probe"
TIMEOUT = 240


@dataclass(frozen=True)
class Program:
    """One zoo case: a program file with its arguments, and what Sentinel should make of it.

    Args:
        id: the test id.
        file: the program, in this folder.
        args: its arguments after the output folder.
        watch: also run it with ``ZOO_WATCH=1`` (the program calls ``sentinel.watch``).
        optimizers: how many optimizers it creates (0: it updates its weights by hand).
        rel: the relative tolerance of Sentinel's norms against the reference (float16
            steps are compared at float16's precision).
        slow: behind the ``zoo_slow`` marker.
        nan_at: the step at which the program puts a NaN in its loss (0: a clean run).
        ranks: run it with ``torchrun --standalone --nproc-per-node RANKS`` (0: plain python).
        spawns: the ranks the program starts itself (``mp.spawn``; 0: none).
        opt: the class of its optimizer(s), as the history should name it.
        objective: the optimizers (by index) whose ``backward()`` value is recorded as the
            scalar ``objective``, not as a loss (they step only coefficients, play a game
            against another optimizer, as a GAN's, or the program trains an agent: it imports
            Gymnasium).
        first_unread: its first step reports no gradient norm: an optimizer's stand-in
            (apex's LARC) scaled the gradients before calling the optimizer's step, whose
            hooks found it (``sentinel/instrument/outerstep.py``); later steps read them first.
        stepped: the optimizers (by creation index) in the order they first step, where
            that is not their creation order: zero-code mode labels its streams in that
            order (``docs/instrumenting.md``), ``sentinel.watch`` in the order of the
            monitors, which the programs make in creation order.
    """

    id: str
    file: str
    args: tuple[str, ...] = ()
    watch: bool = False
    optimizers: int = 1
    rel: float = 1e-5
    slow: bool = False
    nan_at: int = 0
    ranks: int = 0
    spawns: int = 0
    opt: str = ""
    objective: tuple[int, ...] = ()
    first_unread: bool = False
    stepped: tuple[int, ...] = ()


@dataclass
class Run:
    """One run of a program (``mode``: plain, run or watch)."""

    mode: str
    returncode: int
    stdout: str
    stderr: str
    ref: dict[str, Any] | None
    out_dir: Path
    snapshot: dict[str, Any] | None = None
    history: dict[str, Any] | None = None
    files: dict[str, Any] = field(default_factory=dict)
    digested: bool = False
    """``files`` is filled (by :func:`load_files`)."""

    def saved(self) -> dict[str, Any]:
        """The digests of the files the program saved, by path relative to its output folder."""
        out = {}
        for path, entry in self.files.items():
            out[os.path.relpath(path, self.out_dir)] = entry
        return out


def _env(tmp: Path, mode: str, run_name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENTINEL_", "ZOO_"))}
    # the probe folder is on the path in every mode, so the plain run sees the same sys.path
    env["PYTHONPATH"] = os.pathsep.join([str(PROBE), str(ROOT)])
    env["ZOO_REF"] = str(tmp / f"{mode}-ref.json")
    env["PYTHONHASHSEED"] = "0"
    env["OMP_NUM_THREADS"] = "1"  # the same reduction order in every run, whatever the load
    if mode in ("run", "watch"):
        env["SENTINEL_RUN"] = run_name
        env["SENTINEL_CONFIG"] = str(tmp / "sentinel.yaml")
    if mode == "run":
        env["ZOO_SNAPSHOT"] = str(tmp / "snapshot.json")
    if mode == "watch":
        env["ZOO_WATCH"] = "1"
        env["SENTINEL_LISTEN"] = "127.0.0.1:0"
    return env


def _history(path: Path, run_name: str) -> dict[str, Any] | None:
    if not path.exists():
        return None
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        runs = [dict(r) for r in db.execute("SELECT * FROM runs WHERE run = ? ORDER BY id", (run_name,))]
        ids = [r["id"] for r in runs]
        marks = ",".join("?" * len(ids))
        samples = [dict(r) for r in db.execute(
            f"SELECT run_id, step, loss, grad_norm, clip_norm FROM samples WHERE run_id IN ({marks}) "
            "ORDER BY run_id, step", ids)] if ids else []
        alerts = [dict(r) for r in db.execute(
            f"SELECT run_id, alertname, severity, state_to, step, summary FROM alerts WHERE run_id IN ({marks})",
            ids)] if ids else []
    finally:
        db.close()
    return {"runs": runs, "samples": samples, "alerts": alerts}


def _start(prog: Program, mode: str, tmp: Path, run_name: str) -> tuple[subprocess.Popen[str], Path]:
    out_dir = tmp / f"{mode}-out"
    cmd = [sys.executable, str(HERE / prog.file), str(out_dir), *prog.args]
    if prog.ranks:
        cmd[:1] = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", str(prog.ranks)]
    env = _env(tmp, mode, run_name)
    if mode == "run":
        env["ZOO_PROGRAM"] = prog.file
        cmd = [sys.executable, "-m", "sentinel.cli", "run", "--config", env["SENTINEL_CONFIG"],
               "--listen", "127.0.0.1:0", "--", *cmd]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, out_dir


def run_program(prog: Program, tmp: Path) -> dict[str, Run]:
    """Run ``prog`` in every mode it has (plain, run, and watch where set), concurrently,
    then :func:`collect` what they left in ``tmp``. A program of several ranks that any mode's rank
    left by torch's gloo exit abort (``tests.helpers.GLOO_EXIT_ABORT``, plain runs too) runs
    again, every mode, in ``tmp / "retryN"`` (twice at most, with a warning). With
    ``ZOO_REUSE_DIR`` set (the tests keep their folders there) a folder that already holds a
    finished set of runs is read again instead (for working on the tests)."""
    if os.environ.get("ZOO_REUSE_DIR") and (tmp / "done").exists():
        return collect(prog, Path((tmp / "done").read_text()))
    for attempt in range(3):
        folder = tmp / f"retry{attempt}" if attempt else tmp
        folder.mkdir(exist_ok=True)
        ended = _run_modes(prog, folder)
        if not ((prog.ranks or prog.spawns) and any(rc != 0 and GLOO_EXIT_ABORT in err for rc, err in ended)):
            break
        warnings.warn(f"zoo {prog.id}: a rank hit torch's gloo exit abort; attempt {attempt + 2}", stacklevel=1)
    (tmp / "done").write_text(str(folder))
    return collect(prog, folder)


def _run_modes(prog: Program, tmp: Path) -> list[tuple[int, str]]:
    """Every mode of ``prog`` at once in ``tmp``; each one's exit status and stderr."""
    history = tmp / "history.sqlite"
    (tmp / "sentinel.yaml").write_text(f"history: {{path: '{history}', flush_seconds: 0.1}}\n")
    started = {m: _start(prog, m, tmp, _name(prog, m)) for m in _modes(prog)}
    ended = []
    for mode, (proc, _) in started.items():
        try:
            stdout, stderr = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            stderr += f"\n[zoo harness: killed after {TIMEOUT}s]"
        (tmp / f"{mode}-process.json").write_text(json.dumps({"rc": proc.returncode, "stdout": stdout,
                                                               "stderr": stderr}))
        ended.append((proc.returncode, stderr))
    return ended


def _modes(prog: Program) -> list[str]:
    return ["plain", "run"] + (["watch"] if prog.watch else [])


def _name(prog: Program, mode: str) -> str:
    return {"plain": "", "run": f"zoo-{prog.id}", "watch": f"zoo-{prog.id}-watch"}[mode]


def collect(prog: Program, tmp: Path) -> dict[str, Run]:
    """What the runs of ``prog`` left in ``tmp``, and the digests of the files they saved."""
    runs: dict[str, Run] = {}
    for mode in _modes(prog):
        proc = json.loads((tmp / f"{mode}-process.json").read_text())
        ref_path = tmp / f"{mode}-ref.json"
        ref = json.loads(ref_path.read_text()) if ref_path.exists() else None
        runs[mode] = Run(mode, proc["rc"], proc["stdout"], proc["stderr"], ref, tmp / f"{mode}-out")
        if mode != "plain":
            runs[mode].history = _history(tmp / "history.sqlite", _name(prog, mode))
    snap = tmp / "snapshot.json"
    runs["run"].snapshot = json.loads(snap.read_text()) if snap.exists() else None
    return runs


def load_files(programs: list[dict[str, Run]]) -> None:
    """Digest every file the runs of ``programs`` saved, in one fresh Python that cannot
    import sentinel (one for all: each Python that imports torch costs seconds)."""
    runs = [r for p in programs for r in p.values()]
    paths = sorted({str(p) for r in runs for p in r.out_dir.rglob("*") if p.is_file()})
    found: dict[str, Any] = {}
    if paths:
        out = subprocess.run([sys.executable, "-I", str(HERE / "load_saved.py"), str(HERE), *paths],
                             capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
        if out.returncode != 0:
            raise AssertionError(f"load_saved.py failed:\n{out.stderr[-3000:]}")
        found = json.loads(out.stdout)
    for r in runs:
        r.files = {p: e for p, e in found.items() if Path(p).is_relative_to(r.out_dir)}
        r.digested = True


_SAMPLE = re.compile(r"^(sentinel_\w+)\{([^}]*)\} (\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str, name: str, run: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric ``name`` in a /metrics text that belong to run ``run``."""
    out = []
    for metric, labels, value in _SAMPLE.findall(text):
        if metric != name:
            continue
        lab = dict(_LABEL.findall(labels))
        if lab.get("run") == run:
            out.append((lab, float(value)))
    return out


_GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
"""The prefix of torch's own C++-style log lines (``W1203 12:17:56.408000 1010 ...``): its
time and pid differ from run to run."""


def extra_stderr(plain: str, other: str) -> list[str]:
    """The lines of ``other``'s stderr that the plain run did not print (a multiset
    difference; torch's log lines compared without their time and pid)."""
    left = [_GLOG.sub("", line) for line in plain.splitlines()]
    extra = []
    for line in (_GLOG.sub("", line) for line in other.splitlines()):
        if line in left:
            left.remove(line)
        else:
            extra.append(line)
    return extra
