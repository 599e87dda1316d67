"""The capture action, training side: hold the current batch's inputs, save them on request.

Opt-in twice over. The engine sends ``arm`` only when its config has ``actions.capture_on``
(:mod:`sentinel.daemon.evidence`); until then nothing is hooked, held or written. Armed,
a forward pre-hook on the watched model (the DDP wrapper where there is one: the inputs
as the script passed them) keeps *references* to the tensors among the forward's
arguments: no copy, no device sync, nothing read. Bounded:

- only forwards with autograd on (training; an evaluation under ``no_grad`` or
  ``inference_mode`` is not the batch that trained), at most :data:`MAX_FORWARDS` per step
  (micro-batches of an accumulation window; a step a GradScaler skipped counts under the
  same step number), at most :data:`MAX_TENSORS` tensors each, found at most three levels
  deep in lists, tuples and mappings;
- for the last ``steps`` steps only (``actions.capture_steps``). Holding a reference keeps
  that batch's memory alive: a few batches more, the price of having them when asked.
  A script that changes its input tensors in place after the forward changes what is held.

A ``capture`` message (read in the training thread at the next optimizer step, like the
stop action) names the alert's first step N and a folder. The held inputs of step N, or of
the nearest held step (recorded as such), go to a background thread, which copies them to
the CPU, bounds them to ``max_bytes`` (rows kept from the start of the batch dimension,
dim 0, the same count for every tensor that has one) and writes, with mode 0600 into the
engine's folder:

- ``inputs.rank<R>.pt``: ``torch.save`` of a ``dict[str, Tensor]`` and nothing else, so
  ``torch.load(path, weights_only=True)`` reads it without unpickling code (safetensors
  would be a dependency the training side does not take); keys ``args.0``,
  ``kwargs.<name>``, nested ``args.0.input_ids``; later micro-batches ``micro<i>.args.0``;
- ``inputs.rank<R>.json``: which step was asked for and which was saved, each tensor's
  shape, dtype and device, what was truncated, or why nothing was held.

Nothing here raises into training: the hook runs under the monitor's
:class:`~sentinel.instrument.boundary.Boundary`, and the writer thread logs its failure once.
"""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

import torch

from sentinel.instrument import hidden, profiled
from sentinel.instrument.boundary import Boundary

log = logging.getLogger("sentinel")

MAX_FORWARDS = 16
"""Forwards held per step (the last ones of an accumulation window)."""
MAX_TENSORS = 64
"""Tensors held per forward."""
Held = list[tuple[str, torch.Tensor]]


def tensors_of(args: tuple[Any, ...], kwargs: Mapping[str, Any], limit: int = MAX_TENSORS) -> Held:
    """The tensors among a forward's arguments, named by where they were, detached."""
    out: Held = []

    def walk(name: str, v: Any, depth: int) -> None:
        if len(out) >= limit:
            return
        if isinstance(v, torch.Tensor):
            out.append((name, v.detach() if v.requires_grad else v))  # never keep a graph alive
        elif depth < 3 and isinstance(v, (list, tuple)):
            for i, x in enumerate(v[:limit]):
                walk(f"{name}.{i}", x, depth + 1)
        elif depth < 3 and isinstance(v, Mapping):
            for k, x in list(v.items())[:limit]:
                walk(f"{name}.{k}", x, depth + 1)

    for i, a in enumerate(args):
        walk(f"args.{i}", a, 0)
    for k, a in kwargs.items():
        walk(f"kwargs.{k}", a, 0)
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def bound(named: Held, max_bytes: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors to save, at most ``max_bytes`` of them, and what was done to them.

    Over the bound, every tensor with a batch dimension keeps its first ``k`` rows (the
    largest ``k`` that fits; sizes are read from shapes, no data is touched); a
    zero-dimensional one is kept whole. When not even one row fits, nothing is saved.
    Sparse, meta and other non-strided tensors are left out and named.

    Returns:
        ``(name → CPU tensor, description)``; the description has ``tensors`` (shape,
        dtype, device, saved shape per name), ``bytes``, and ``truncated`` or ``note``.
    """
    usable = [(n, t) for n, t in named if t.layout == torch.strided and t.device.type != "meta"]
    info: dict[str, Any] = {"tensors": {n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                                            "device": str(t.device), "saved_shape": None} for n, t in named}}
    left_out = [n for n, _ in named if all(n != m for m, _ in usable)]
    if left_out:
        info["left_out"] = left_out
    total = sum(_nbytes(t) for _, t in usable)
    info["bytes"], info["max_bytes"] = total, max_bytes
    rows = total
    if total > max_bytes:
        fixed = sum(_nbytes(t) for _, t in usable if t.dim() == 0)
        per_row = sum(_nbytes(t) // max(1, t.shape[0]) for _, t in usable if t.dim() > 0)
        rows = (max_bytes - fixed) // per_row if per_row and max_bytes > fixed else 0
        if rows < 1:
            info["note"] = (f"the inputs ({total} bytes) exceed actions.capture_max_bytes ({max_bytes}) even at "
                            "one row of the batch: nothing saved")
            return {}, info
        info["truncated"] = {"rows_kept": int(rows), "batch_rows": max(t.shape[0] for _, t in usable if t.dim() > 0),
                             "why": f"the inputs ({total} bytes) exceed actions.capture_max_bytes ({max_bytes})"}
    out: dict[str, torch.Tensor] = {}
    for n, t in usable:
        kept = t if t.dim() == 0 or total <= max_bytes else t[:rows]
        out[n] = kept.detach().to("cpu", copy=True)  # a compact copy: a view would save its whole storage
        info["tensors"][n]["saved_shape"] = list(out[n].shape)
    return out, info


def _write_private(path: str, data: bytes) -> None:
    """A new file, mode 0600; never follows a link, never replaces a file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class InputCapture:
    """Holds a watched model's recent inputs once armed; writes them when asked.

    Args:
        model: the module whose forward receives the batch (None: nothing to hold).
        steps_done: the monitor's completed optimizer steps (a forward belongs to the next).
        rank: this process's rank (the files' names; a capture for other ranks is ignored).
        boundary: the monitor's boundary, around the hook.
    """

    def __init__(self, model: torch.nn.Module | None, steps_done: Callable[[], int], rank: int,
                 boundary: Boundary) -> None:
        # held weakly: the monitor lives as long as the model it watches (hidden.HiddenHandle)
        self._model = weakref.ref(model) if model is not None else None
        self.steps_done, self.rank, self.boundary = steps_done, rank, boundary
        self.keep = 0
        """Steps held (0: not armed, nothing hooked)."""
        self.handle: Any = None
        self.held: OrderedDict[int, deque[Held]] = OrderedDict()
        self.writers: list[threading.Thread] = []

    @property
    def model(self) -> torch.nn.Module | None:
        """The watched module, while it lives."""
        return self._model() if self._model is not None else None

    def arm(self, msg: Mapping[str, Any]) -> None:
        """Start holding inputs (the engine's ``arm`` message); again: only the bound changes."""
        if msg.get("rank") not in (None, self.rank):
            return
        self.keep = max(1, min(64, int(msg.get("steps", 4))))
        model = self.model
        if self.handle is None and model is not None and hidden.hookable(model):
            pre = torch.compiler.disable(self._pre)
            self.handle = hidden.register(model, "pre", pre, with_kwargs=True)
        while len(self.held) > self.keep:
            self.held.popitem(last=False)

    def _pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if torch.is_grad_enabled():  # not a no_grad/inference_mode evaluation
            self.boundary.run("capture", self._hold, args, kwargs)

    @profiled.labelled(profiled.CAPTURE)
    def _hold(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        step = self.steps_done() + 1
        forwards = self.held.get(step)
        if forwards is None:
            forwards = self.held[step] = deque(maxlen=MAX_FORWARDS)
            while len(self.held) > self.keep:
                self.held.popitem(last=False)
        forwards.append(tensors_of(args, kwargs))

    def take(self, msg: Mapping[str, Any]) -> None:
        """Save the inputs a ``capture`` message asks for, off this thread."""
        ranks = list(msg.get("ranks") or [])
        folder = msg.get("folder")
        if (ranks and self.rank not in ranks) or not isinstance(folder, str):
            return
        want = int(msg.get("step", 0))
        desc: dict[str, Any] = {"format": "sentinel-inputs/1", "alertname": msg.get("alertname"),
                                "rank": self.rank, "requested_step": want, "step": None}
        forwards: list[Held] = []
        if self.held:
            step = min(self.held, key=lambda s: (abs(s - want), s))
            forwards = list(self.held[step])
            desc.update(step=step, exact=step == want, forwards=len(forwards), held_steps=list(self.held))
            if step != want:
                desc["note"] = f"step {want} was no longer held (the last {self.keep} steps are): the nearest is saved"
        else:
            desc["note"] = ("no model is watched: no inputs to hold" if self._model is None else
                            "no inputs held: capture was not armed yet, or no training forward ran")
        named = [((f"micro{i}." if i else "") + n, t) for i, f in enumerate(forwards) for n, t in f]
        limit = max(1024, int(msg.get("max_bytes", 4 * 2**20)))
        w = threading.Thread(target=self._write, args=(folder, named, desc, limit),
                             name="sentinel-capture", daemon=True)
        self.writers = [t for t in self.writers if t.is_alive()] + [w]
        w.start()

    def _write(self, folder: str, named: Held, desc: dict[str, Any], max_bytes: int) -> None:
        try:
            st = os.lstat(folder)  # the engine's new folder, ours: never a link, never another's
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                raise PermissionError(f"{folder} is not a folder of this user")
            tensors, info = bound(named, max_bytes)
            desc.update(info)
            if tensors:
                buf = io.BytesIO()
                torch.save(tensors, buf)
                desc["file"] = f"inputs.rank{self.rank}.pt"
                _write_private(os.path.join(folder, desc["file"]), buf.getvalue())
            _write_private(os.path.join(folder, f"inputs.rank{self.rank}.json"),
                           json.dumps(desc, indent=1, default=str).encode())
        except Exception:  # a lost capture, never a lost run
            log.warning("sentinel capture: could not save the inputs in %s", folder, exc_info=True)

    def close(self, timeout: float = 10.0) -> None:
        """Remove the hook, drop the held references, let pending writes finish."""
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        self.held.clear()
        for w in self.writers:
            w.join(timeout)
        self.writers.clear()
