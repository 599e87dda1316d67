"""The capture action, engine side: the evidence of an alert, written when it fires.

``actions.capture_on`` (severities or rule names, like ``stop_on``) is opt-in. When a
matching alert fires, :meth:`Capturer.capture` runs on the engine's thread, *before* the
transition's notifications are stored, so every message can name the files:

- a folder of its own, ``<capture_dir>/<job>/<run>/<UTC time>-step<N>-<alertname>/``
  (0700; names sanitised, so a run called ``..`` cannot climb out);
- ``evidence.json`` in it (0600, plain JSON; never pickle): the alert (name, severity,
  summary, steps, ranks, groups, value, causes, first checks) and, for each of its first
  ranks, what the seeds' first checks ask for, read from the engine's store: the last
  :data:`HISTORY` samples of the loss, grad norm (before and after clipping), AMP loss
  scale and learning rate, and every group's grad norm, parameter norm and update ratio
  at the alert's step (the latest sample at or before it, with its step). Non-finite
  numbers are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (valid JSON);
- the inputs: each rank of the alert writes ``inputs.rank<R>.pt`` and ``inputs.rank<R>.json``
  there itself (:mod:`sentinel.instrument.capture`), told by a ``capture`` message on the
  stop action's channel. The engine cannot wait for them; the evidence lists their names.

The training processes learn that capture is on from an ``arm`` message sent on each
rank's first frame (:meth:`Capturer.arm_message`), so without ``capture_on`` no hook is
installed and nothing is written. At most ``capture_keep`` capture folders are kept per
run; the oldest go first (only folders named as above are ever deleted).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from sentinel.files import safe_name
from sentinel.rules.alert import Transition
from sentinel.store import Labels, Store

log = logging.getLogger("sentinel")

HISTORY = 100
"""Samples of each whole-model series written to the evidence (the store keeps 512)."""
MAX_RANKS = 8
"""Ranks of one alert whose series are written (the alert lists them all)."""
SERIES = {"loss": "sentinel_loss", "grad_norm": "sentinel_grad_norm",
          "grad_norm_before_clip": "sentinel_grad_norm_preclip", "amp_loss_scale": "sentinel_amp_loss_scale",
          "learning_rate": "sentinel_learning_rate", "gradient_variance_ratio": "sentinel_gradient_variance_ratio"}
"""Evidence key → the store's metric, for the histories."""
GROUP_SERIES = {"grad_norm": "sentinel_group_grad_norm", "param_norm": "sentinel_group_param_norm",
                "update_ratio": "sentinel_group_update_ratio"}
"""Evidence key → the store's per-group metric, read at the alert's step."""
_FOLDER = re.compile(r"^\d{8}T\d{6}\.\d{3}Z-step\d+-[A-Za-z0-9_.-]+$")


def default_dir() -> Path:
    """``$XDG_STATE_HOME/sentinel/captures``, else ``~/.local/state/sentinel/captures``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "sentinel" / "captures"


def inputs_name(rank: int) -> tuple[str, str]:
    """The file names rank ``rank`` writes its inputs to: ``(tensors, description)``."""
    return f"inputs.rank{rank}.pt", f"inputs.rank{rank}.json"


def _private_dir(path: Path) -> None:
    """Create ``path`` and any missing parents with mode 0700 (``os.makedirs`` gives the
    parents the umask's mode)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass


def _write_private(path: Path, data: bytes) -> None:
    """Write a new file with mode 0600; never follows a link, never replaces a file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _num(x: float) -> float | str:
    """A JSON number, or ``"nan"``/``"inf"``/``"-inf"`` for the values JSON cannot hold."""
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


class Capturer:
    """Matches firing transitions against ``capture_on`` and writes their evidence.

    Args:
        capture_on: severities and rule names (validated at config load).
        folder: the capture root (``""``: :func:`default_dir`).
        store: the engine's series store (read under its lock).
        keep: capture folders kept per run.
        max_bytes, steps: handed to the training processes (``arm``, ``capture`` messages).
        clock: wall clock, for folder names.
    """

    def __init__(self, capture_on: list[str], folder: str, store: Store, keep: int = 20,
                 max_bytes: int = 4 * 2**20, steps: int = 4, clock: Any = time.time) -> None:
        self.capture_on = frozenset(capture_on)
        self.root = (Path(folder).expanduser() if folder else default_dir()).absolute()  # the ranks write there too
        self.store = store
        self.keep, self.max_bytes, self.steps = keep, max_bytes, steps
        self.clock = clock
        self.written = 0
        """Evidence files written."""
        self.failed = 0
        """Captures that could not be written (a full disk, a folder not ours)."""
        self._armed: set[tuple[Any, ...]] = set()

    def wants(self, t: Transition) -> bool:
        """Whether ``t`` is a firing that ``capture_on`` names (by severity or rule name)."""
        return t.state_to == "firing" and (t.severity in self.capture_on or t.alertname in self.capture_on)

    def arm_message(self, frame: dict[str, Any]) -> dict[str, Any] | None:
        """The ``arm`` message for a rank's first step frame (None for any later frame): it
        tells that rank to start holding its inputs. A restarted process has a new reply
        socket (a shared daemon's) or a new engine (an embedded one), so it is armed again."""
        if frame.get("kind") != "step":
            return None
        key = (frame.get("job"), frame.get("run"), frame.get("rank"), frame.get("reply"))
        if key in self._armed:
            return None
        if len(self._armed) > 65_536:  # bounded; arming twice does no harm
            self._armed.clear()
        self._armed.add(key)
        return {"kind": "arm", "job": frame.get("job"), "run": frame.get("run"), "rank": frame.get("rank"),
                "steps": self.steps}

    def capture(self, t: Transition) -> dict[str, Any] | None:
        """Write the evidence of a firing ``t`` (the engine's thread); None when it cannot.

        Returns:
            ``{"folder", "evidence", "inputs": [paths], "message": {...}}``: the paths the
            notifications name, and the ``capture`` message for the training processes.
        """
        try:
            return self._capture(t)
        except OSError as exc:
            self.failed += 1
            log.warning("sentinel capture: could not write the evidence of %s in %s (%s)", t.alertname,
                        self.root, exc.strerror or type(exc).__name__)
            return None

    def _capture(self, t: Transition) -> dict[str, Any]:
        run_dir = self.root / safe_name(t.job) / safe_name(t.run)
        _private_dir(run_dir)
        now = self.clock()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
        base = f"{stamp}-step{t.started_step}-{safe_name(t.alertname)}"
        folder = run_dir / base
        for n in range(1, 100):  # two captures in one millisecond: a suffix
            try:
                os.mkdir(folder, 0o700)
                break
            except FileExistsError:
                folder = run_dir / f"{base}.{n}"
        else:
            raise FileExistsError(f"{folder} exists")
        ranks = list(t.ranks)
        inputs = {str(r): dict(zip(("tensors", "description"), inputs_name(r))) for r in ranks}
        doc: dict[str, Any] = {
            "format": "sentinel-evidence/1",
            "alert": {k: (_num(v) if k in ("value", "threshold") and isinstance(v, float) else v)
                      for k, v in t.to_json().items() if k not in ("notify", "state_from")},
            "written_at": now,
            "inputs": {
                "step": t.started_step,
                "files": inputs,
                "note": "each rank of the alert writes its watched model's inputs of this step here, "
                        "shortly after this file: tensors only (torch.load(path, weights_only=True)); "
                        "the description says which step was held, and what was truncated or why "
                        "nothing was held",
            },
            "ranks": {str(r): self._rank(t, r) for r in ranks[:MAX_RANKS]},
        }
        if len(ranks) > MAX_RANKS:
            doc["ranks_left_out"] = len(ranks) - MAX_RANKS
        evidence = folder / "evidence.json"
        _write_private(evidence, json.dumps(doc, indent=1, allow_nan=False).encode())
        self.written += 1
        self._prune(run_dir)
        message = {"kind": "capture", "job": t.job, "run": t.run, "ranks": ranks, "step": t.started_step,
                   "alert_step": t.step, "alertname": t.alertname, "folder": str(folder),
                   "max_bytes": self.max_bytes}
        return {"folder": str(folder), "evidence": str(evidence),
                "inputs": [str(folder / inputs_name(r)[0]) for r in ranks], "message": message}

    def _rank(self, t: Transition, rank: int) -> dict[str, Any]:
        """The histories and the per-group norms of one rank."""
        want = {"job": t.job, "run": t.run, "rank": str(rank)}
        out: dict[str, Any] = {"history": {}, "groups": {}}
        for key, metric in SERIES.items():
            for labels in self._labelsets(metric, want):
                w = self.store.window(metric, labels, HISTORY)
                if w is None or not len(w):
                    continue
                extra = {k: v for k, v in labels if k not in want}
                name = key if not extra else key + "{" + ",".join(f"{k}={v}" for k, v in sorted(extra.items())) + "}"
                out["history"][name] = {"steps": [int(s) for s in w.steps],
                                        "values": [_num(v) for v in w.values]}
        for key, metric in GROUP_SERIES.items():
            for labels in self._labelsets(metric, want):
                group = dict(labels).get("group")
                at = self._at(metric, labels, t.step) if group is not None else None
                if at is not None:
                    out["groups"].setdefault(group, {})[key] = {"step": at[0], "value": _num(at[1])}
        return out

    def _labelsets(self, metric: str, want: dict[str, str]) -> list[Labels]:
        return [ls for ls in self.store.labelsets(metric)
                if all(dict(ls).get(k) == v for k, v in want.items())]

    def _at(self, metric: str, labels: Labels, step: int) -> tuple[int, float] | None:
        """The latest sample at or before ``step`` (the alert's), as ``(step, value)``."""
        w = self.store.window(metric, labels)
        if w is None:
            return None
        for s, v in zip(reversed(w.steps.tolist()), reversed(w.values.tolist())):
            if s <= step:
                return int(s), float(v)
        return None

    def _prune(self, run_dir: Path) -> None:
        """Delete the oldest capture folders of the run past ``keep`` (names sort by time)."""
        folders = sorted(p.name for p in run_dir.iterdir() if _FOLDER.match(p.name) and p.is_dir()
                         and not p.is_symlink())
        for name in folders[:max(0, len(folders) - self.keep)]:
            shutil.rmtree(run_dir / name, ignore_errors=True)
