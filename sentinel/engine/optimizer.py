"""The optimizers a rank steps: an info series and the numeric gauges the advice rules read.

From a frame's ``optim`` (instrument/optinfo.py), per optimizer (labelled ``optimizer``,
its class, and ``index``, its position):

- ``sentinel_optimizer_info{optimizer, index, dtype} 1``;
- ``sentinel_optimizer_hyperparameter{optimizer, index, name}``: lr, beta1, beta2, eps,
  weight_decay, momentum as reported;
- what the advice rules compare, written only where the advice applies:
  ``sentinel_optimizer_beta2_memory_ratio`` (1/(1-β2) over the planned steps, when the
  user gave them), ``sentinel_optimizer_fp16_eps`` (eps of an optimizer with fp16
  parameters, hence fp16 state) and ``sentinel_optimizer_decoupled_weight_decay``
  (weight decay of AdamW-style optimizers), ``sentinel_optimizer_sgd_clip_max_norm`` (the
  ``max_norm`` an SGD-family optimizer's gradients were last clipped to, else the bound
  each sample's gradient is clipped to under differential privacy (``hp``'s
  ``sample_clip``), 0 when they never were);
- ``sentinel_optimizer_adaptive`` (no optimizer label): 1 when every optimizer scales its
  updates by its gradients' own size, so that a large gradient norm is no large update
  (``GradientExplosion`` reads it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sentinel.wire import HYPERPARAMETERS, optimizer_records

_ADAPTIVE = ("Adagrad", "Adadelta", "RMSprop", "Rprop", "Adafactor", "Lion", "Lamb", "LAMB", "SophiaG", "Sophia")


def _adaptive(cls: str, nums: dict[str, float]) -> bool:
    """Each update is scaled by the gradients' own size (a second moment, or their sign):
    anything with a ``beta2`` (Adam and its many kin), and the classes of :data:`_ADAPTIVE`."""
    return "beta2" in nums or cls in _ADAPTIVE


def _sgd_family(cls: str, nums: dict[str, float]) -> bool:
    """Plain gradient descent, with or without momentum (no adaptive scaling of its own)."""
    return cls in ("SGD", "SGDW") or ("momentum" in nums and "beta1" not in nums and "beta2" not in nums)


def ingest_optimizers(optim: Any, total_steps: Any, add: Callable[..., None], clip_max: float | None = None) -> None:
    """Queue the gauges of one frame's ``optim`` list (ignored unless well formed).

    ``clip_max`` is the ``max_norm`` the rank's gradients were last clipped to (None: never).
    """
    records = optimizer_records(optim)
    if records is None:
        return
    adaptive = True
    for i, o in enumerate(records):
        name, idx, dtype = o.cls, str(i), o.dtype
        add("sentinel_optimizer_info", 1.0, index=idx, dtype=dtype, **{"class": name})
        nums = o.hp.given()
        for k in HYPERPARAMETERS:
            if k in nums:
                add("sentinel_optimizer_hyperparameter", nums[k], index=idx, name=k, **{"class": name})
        b2 = nums.get("beta2")
        if b2 is not None and b2 < 1.0 and isinstance(total_steps, int) and total_steps > 0:
            add("sentinel_optimizer_beta2_memory_ratio", 1.0 / (1.0 - b2) / total_steps, index=idx, **{"class": name})
        if "eps" in nums and dtype == "float16":
            add("sentinel_optimizer_fp16_eps", nums["eps"], index=idx, **{"class": name})
        if nums.get("decoupled") and "weight_decay" in nums:
            add("sentinel_optimizer_decoupled_weight_decay", nums["weight_decay"], index=idx, **{"class": name})
        if "beta1" in nums:
            add("sentinel_optimizer_beta1", nums["beta1"], index=idx, **{"class": name})
        if _sgd_family(name, nums):  # clip_max inf: the norm read, nothing clipped
            limit = clip_max if clip_max and math.isfinite(clip_max) else nums.get("sample_clip", 0.0)
            add("sentinel_optimizer_sgd_clip_max_norm", limit, index=idx, **{"class": name})
        adaptive = adaptive and _adaptive(name, nums)
    if optim:
        add("sentinel_optimizer_adaptive", 1.0 if adaptive else 0.0)


RATIO_FIGURES = ("adafactor_saturation", "lion_sign_agreement", "sophia_clip_fraction")


def ingest_health(f: dict[str, Any], add: Callable[..., None]) -> list[float | None] | None:
    """Queue the per-optimizer figures of a frame (instrument/optstate.py); return its
    per-group LAMB trust ratios for the caller to write as a group row (or None)."""
    health = f.get("opt_health")
    if isinstance(health, dict):
        for name, pair in health.items():
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], (int, float)) and pair[1] > 0):
                continue
            value = float(pair[0]) / float(pair[1])
            if name in RATIO_FIGURES:
                add("sentinel_optimizer_health_ratio", value, figure=name)
            elif name == "sophia_hessian_mean":
                add("sentinel_optimizer_hessian_mean", value)
    tr = f.get("trust_ratio")
    if not isinstance(tr, list):
        return None
    known = [float(v) for v in tr if isinstance(v, (int, float))]
    if known:
        add("sentinel_trust_ratio", sum(known) / len(known))
    return [float(v) if isinstance(v, (int, float)) else None for v in tr]
