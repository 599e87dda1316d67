"""Host-side probes: cheap reads that need no device work (memory, optimizer state, lr)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

import torch

from sentinel.instrument import cgroup
from sentinel.instrument.registry import stepper
from sentinel.wire import MAX_PARAM_GROUPS, MAX_STATE_KEYS

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def state_bytes(optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, int]:
    """Bytes of optimizer state by state key (``exp_avg``, ``momentum_buffer``, …).

    Factored states (Adafactor's ``row_var``/``col_var``) and one-element ones (LAMB's
    ``trust_ratio``) count at their real size; the ``step`` counter is left out, so the
    ratio to parameter bytes is the state's. A DTensor (FSDP2) counts its local shard:
    what this rank holds. Reads tensor metadata only; no device work.

    The keys are what a frame carries (:data:`~sentinel.wire.MAX_STATE_KEYS`): strings of up
    to 64 characters (an optimizer's own key that is no string, or longer, is written out
    and cut), and past the 63rd the bytes of further keys are summed under ``other``.
    """
    out: dict[str, int] = {}
    for opt in optimizers:
        for st in stepper(opt).state.values():
            for key, val in st.items():
                if key == "step" or not isinstance(val, torch.Tensor):
                    continue  # the step counter is bookkeeping, not state memory
                local = getattr(val, "_local_tensor", None)  # FSDP2: this rank's shard, not the global size
                t = local if isinstance(local, torch.Tensor) else val
                name = key if type(key) is str and 0 < len(key) <= 64 else (str(key)[:64] or "?")
                if name not in out and len(out) >= MAX_STATE_KEYS - 1:
                    name = "other"
                out[name] = out.get(name, 0) + t.numel() * t.element_size()
    return out


def _groups(optimizers: Sequence[torch.optim.Optimizer]) -> Iterator[dict[str, Any]]:
    """The param groups of the optimizers in order, the first :data:`~sentinel.wire.MAX_PARAM_GROUPS`
    (what a frame carries: more, and the engine would drop every rate of the frame)."""
    return islice((g for opt in optimizers for g in opt.param_groups), MAX_PARAM_GROUPS)


def learning_rates(optimizers: Sequence[torch.optim.Optimizer]) -> list[float]:
    """The learning rate of every param group, optimizers in order (at most
    :data:`~sentinel.wire.MAX_PARAM_GROUPS`)."""
    out: list[float] = []
    for group in _groups(optimizers):
        lr = group.get("lr", float("nan"))
        if isinstance(lr, torch.Tensor):
            # a tensor lr on an accelerator would need a sync to read: skip it
            lr = float(lr) if lr.device.type == "cpu" else float("nan")
        out.append(float(lr) if lr is not None else float("nan"))
    return out


def host_memory() -> dict[str, float]:
    """Resident set size of this process and the memory limit it runs under."""
    out: dict[str, float] = {}
    try:
        with open("/proc/self/statm", "rb") as f:
            out["host_rss"] = float(int(f.read().split()[1]) * _PAGE)
    except (OSError, ValueError, IndexError):
        pass
    limit = _cgroup_limit()
    if limit:
        out["host_limit"] = float(limit)
    return out


def _cgroup_limit() -> int | None:
    """The process's own cgroup limit (nested, v1 or v2), else the machine's memory."""
    found = cgroup.effective_limit()
    return found[0] if found else None


_TOTALS: dict[int, int] = {}


def cuda_memory(devices: Sequence[torch.device]) -> dict[str, float]:
    """CUDA allocator figures summed over the devices. Reads host-side counters only."""
    out = {"cuda_allocated": 0.0, "cuda_reserved": 0.0, "cuda_peak": 0.0, "cuda_total": 0.0,
           "cuda_retries": 0.0, "cuda_ooms": 0.0}
    for d in devices:
        if d.type != "cuda":
            continue
        idx = d.index if d.index is not None else torch.cuda.current_device()
        st = torch.cuda.memory_stats(idx)
        out["cuda_allocated"] += st.get("allocated_bytes.all.current", 0)
        out["cuda_reserved"] += st.get("reserved_bytes.all.current", 0)
        out["cuda_peak"] += st.get("allocated_bytes.all.peak", 0)
        out["cuda_retries"] += st.get("num_alloc_retries", 0)
        out["cuda_ooms"] += st.get("num_ooms", 0)
        if idx not in _TOTALS:
            _TOTALS[idx] = torch.cuda.get_device_properties(idx).total_memory
        out["cuda_total"] += _TOTALS[idx]
    return out


def schedule_peaks(optimizers: Sequence[torch.optim.Optimizer]) -> list[float] | None:
    """The learning rate each param group's torch scheduler scales from, where one is set:
    ``max_lr`` (OneCycleLR) or ``initial_lr`` (every ``LRScheduler`` writes it into the
    group at construction); NaN for groups without. None when no group has one.

    A warmup starts far below this value, and a decay ends far below it: the engine judges
    the current lr against it (see :mod:`sentinel.engine.schedule`)."""
    out: list[float] = []
    seen = False
    for group in _groups(optimizers):
        peak = group.get("max_lr", group.get("initial_lr"))
        if isinstance(peak, torch.Tensor):
            peak = float(peak) if peak.device.type == "cpu" else None
        if isinstance(peak, (int, float)) and not isinstance(peak, bool):
            out.append(float(peak))
            seen = True
        else:
            out.append(float("nan"))
    return out if seen else None
