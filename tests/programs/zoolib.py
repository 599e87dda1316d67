"""What every zoo program shares: its reference values, and the line it ends with.

A program calls :meth:`Reference.step` once per optimizer step (``optimizer`` is the index
of the optimizer, in creation order, for programs with several), with the values taken at
the moment its gradients are final: the step's loss as the program computed it, the
gradient norm the optimizer applies, and the norm before clipping where it clips. At the
end :meth:`Reference.finish` prints the final weights' checksum and writes everything to
the JSON file named by ``ZOO_REF`` (nothing when unset). Only the standard library and
torch: the programs never import sentinel unless ``ZOO_WATCH=1`` says so.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
from typing import Any

import torch


def total_norm(params: Any) -> float:
    """torch's own total L2 norm of the gradients, as they are now (complex: |g|, real)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return math.nan
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach(), dtype=torch.float64)
                                                        if not g.is_complex() else
                                                        torch.linalg.vector_norm(g.detach()).double()
                                                        for g in grads])))


def checksum(*modules: torch.nn.Module) -> str:
    """sha256 of every parameter's and buffer's bytes, in state_dict order."""
    h = hashlib.sha256()
    for m in modules:
        for name, t in m.state_dict().items():
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for ``MASTER_PORT``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_rendezvous() -> None:
    """The env:// variables of a world of one, where torchrun set none: a script written for
    torchrun run plainly for a smoke test (``init_process_group`` then reads them)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")


def watching() -> bool:
    """True when the harness runs the program with ``sentinel.watch`` (``ZOO_WATCH=1``)."""
    return os.environ.get("ZOO_WATCH") == "1"


class Reference:
    """The program's own record of each optimizer step, for the harness to compare."""

    def __init__(self, optimizers: int = 1) -> None:
        self.steps: list[list[dict[str, float | None]]] = [[] for _ in range(optimizers)]
        self.saved: list[str] = []
        self.extra: dict[str, Any] = {}

    def step(self, loss: Any, grad_norm: float, preclip: float | None = None, optimizer: int = 0) -> None:
        value = float(loss.detach().double().sum()) if isinstance(loss, torch.Tensor) else float(loss)
        self.steps[optimizer].append({"loss": value, "grad_norm": float(grad_norm),
                                      "preclip": None if preclip is None else float(preclip)})

    def saved_file(self, path: str) -> None:
        self.saved.append(os.path.abspath(path))

    def finish(self, *modules: torch.nn.Module) -> None:
        if os.environ.get("RANK", "0") == "0":
            print("checksum", checksum(*modules), flush=True)
        out = os.environ.get("ZOO_REF")
        if not out or os.environ.get("RANK", "0") != "0":  # rank 0's, under torchrun
            return
        with open(out, "w") as f:
            json.dump({"optimizers": self.steps, "optimizer_steps": [len(s) for s in self.steps],
                       "saved": self.saved, "extra": self.extra}, f, allow_nan=True)
