"""What the run runs on (seed 004 §2.4: record the framework and CUDA versions and the GPU
model before any test; seed 000 §4.1: TF32 off and deterministic settings while debugging).

Host-side reads only: library versions, the device name from the CUDA runtime's cached
properties, and torch's flags. No device work, no synchronisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

MAX_VALUE = 64
"""Characters kept of each value (they become label values of an info series)."""


@lru_cache(maxsize=1)
def _versions() -> tuple[tuple[str, str], ...]:
    out = {"torch": torch.__version__, "cuda": str(torch.version.cuda or "none")}
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a broken cuDNN install must not break training
        cudnn = None
    out["cudnn"] = str(cudnn) if cudnn else "none"
    nccl = "none"
    try:
        if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        pass
    out["nccl"] = nccl
    return tuple(out.items())


def describe(devices: Sequence[torch.device]) -> dict[str, str]:
    """Versions (torch, CUDA, cuDNN, NCCL), the GPU model and the numerics flags.

    Args:
        devices: the devices the watched parameters live on.

    Returns:
        Short string values, ``"none"`` where something is absent.
    """
    out = dict(_versions())
    models = sorted({torch.cuda.get_device_name(d) for d in devices if d.type == "cuda"})
    out["gpu_model"] = ", ".join(models) or "none"
    out["tf32_matmul"] = str(bool(torch.backends.cuda.matmul.allow_tf32)).lower()
    out["tf32_cudnn"] = str(bool(torch.backends.cudnn.allow_tf32)).lower()
    out["deterministic"] = str(bool(torch.are_deterministic_algorithms_enabled())).lower()
    out["cudnn_deterministic"] = str(bool(torch.backends.cudnn.deterministic)).lower()
    out["cudnn_benchmark"] = str(bool(torch.backends.cudnn.benchmark)).lower()
    return {k: v[:MAX_VALUE] for k, v in out.items()}
