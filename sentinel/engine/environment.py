"""``sentinel_environment_info``: one info series per rank with what it runs on."""

from __future__ import annotations

from typing import Any

from sentinel.store import Labels

KEYS = ("torch", "cuda", "cudnn", "nccl", "gpu_model", "tf32_matmul", "tf32_cudnn", "deterministic",
        "cudnn_deterministic", "cudnn_benchmark")
"""The labels the info series may carry; anything else a frame sends is ignored."""
MAX_VALUE = 64


def env_labels(base: Labels, env: Any) -> Labels | None:
    """The info series' labels: ``base`` plus the known keys of a frame's ``env`` (strings
    cut to :data:`MAX_VALUE`); None when ``env`` is not a mapping of them."""
    if not isinstance(env, dict):
        return None
    extra = tuple((k, str(env[k])[:MAX_VALUE]) for k in KEYS if isinstance(env.get(k), (str, int, float)))
    if not extra:
        return None
    return tuple(sorted(base + extra))
