"""Which optimizers a run steps, and with what hyperparameters, in a bounded form.

Sent at the first step, after ``load_state_dict`` and every ``state_every`` steps, so the
engine can give the seeds' optimizer-specific advice (seed 000 §3.2 betas, §3.4 eps in
fp16, §5.2 weight decay). One small map per optimizer, whatever the number of groups:

- ``class``: the optimizer's class name (64 characters at most);
- ``dtype``: the lowest-precision floating dtype among its parameters (``float16``,
  ``bfloat16``, ``float32``...), which decides whether its state is fp16;
- ``hp``: numbers reduced over its param groups the way the advice reads them: ``beta1``
  and ``momentum`` the smallest, ``beta2`` the largest, ``eps`` the smallest,
  ``weight_decay`` and ``lr`` the largest; ``decoupled`` 1 when weight decay is applied
  apart from the gradient (AdamW, Lion, ``decoupled_weight_decay=True``). ``lr`` is the
  one the script set, before any schedule (:func:`_configured_lr`), or the highest a group
  has been at since the optimizer's state began, where that is higher (a schedule written
  by hand, which keeps no base). ``sample_clip``: the norm each sample's gradient is
  clipped to before the step, where a differentially private wrapper steps it (Opacus's
  ``DPOptimizer``: :func:`.outerstep.sample_clip`).

Host-side reads of the param groups only: a tensor-valued hyperparameter on an accelerator
is left out (reading it would sync).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from sentinel import wire
from sentinel.instrument import outerstep

_SIZE = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}
_DECOUPLED = ("AdamW", "Lion", "Lamb", "LAMB")


def _num(v: Any) -> float | None:
    if isinstance(v, torch.Tensor):
        if v.device.type != "cpu" or v.numel() != 1:
            return None
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _configured_lr(group: dict[str, Any]) -> Any:
    """A group's learning rate as the script set it, not where its schedule is now: a warmup
    from 0 (Hugging Face's ``get_linear_schedule_with_warmup``) reads 0 at the first step and
    a linear decay 0 at the last, so every run of a sweep would be recorded at lr 0. That is
    ``OneCycleLR``'s ``max_lr``, else the base every scheduler keeps as ``initial_lr``, else the
    group's ``lr`` (no scheduler; ``ReduceLROnPlateau`` keeps no base). The lr of each step is
    the frames' ``lr`` (``sentinel_lr``)."""
    if "max_lr" in group:
        return group["max_lr"]
    return group.get("initial_lr", group.get("lr"))


def describe(optimizers: Sequence[torch.optim.Optimizer], top: Sequence[float] = ()) -> list[wire.OptimizerRecord]:
    """The bounded description of each optimizer (see the module docstring). ``top``: the
    highest lr each param group has been at (the groups of every optimizer in order, as
    ``probes.learning_rates``), for a schedule written by hand: nanoGPT's ``get_lr``, MAE's
    ``adjust_learning_rate`` set ``group["lr"]`` at each step, keep no base, and left a run
    recorded at its last rate, 1e-7 for a fine-tune at 1e-3."""
    out: list[wire.OptimizerRecord] = []
    flat = 0  # the position of the optimizer's first group in ``top``
    for opt in optimizers[:wire.MAX_OPTIMIZERS]:
        hp: dict[str, list[float]] = {}
        bound = outerstep.sample_clip(opt)
        if bound is not None:
            hp["sample_clip"] = [bound]
        dtypes: set[torch.dtype] = set()
        for g in opt.param_groups:
            seen = top[flat] if flat < len(top) else math.nan
            flat += 1
            if seen == seen:
                hp.setdefault("lr", []).append(seen)
            for p in g["params"]:
                if p.is_floating_point():
                    dtypes.add(p.dtype)
            betas = g.get("betas")
            if isinstance(betas, (tuple, list)) and len(betas) >= 2:
                for name, v in (("beta1", betas[0]), ("beta2", betas[1])):
                    x = _num(v)
                    if x is not None:
                        hp.setdefault(name, []).append(x)
            for name in ("lr", "eps", "weight_decay", "momentum"):
                x = _num(_configured_lr(g) if name == "lr" else g.get(name))
                if x is not None:
                    hp.setdefault(name, []).append(x)
            if g.get("decoupled_weight_decay") is True:
                hp.setdefault("decoupled", []).append(1.0)
        name = type(opt).__name__[:64]
        reduced = {k: (min(v) if k in ("beta1", "momentum", "eps") else max(v)) for k, v in hp.items()}
        if name in _DECOUPLED:
            reduced["decoupled"] = 1.0
        low = min(dtypes, key=lambda d: _SIZE.get(d, 2)) if dtypes else None
        out.append(wire.OptimizerRecord(cls=name, dtype=str(low).removeprefix("torch.")[:16] if low else "none",
                                        hp=wire.Hyperparameters(**reduced)))
    return out


def one_update_a_step(opt: Any) -> bool:
    """Whether one ``step()`` is one update of the parameters: not LBFGS's, which runs up to
    ``max_iter`` iterations (20 by default), each with its own search along a direction, so
    that a step's change of the weights is many updates' and the update-size rules of thumb
    (a tenth of the weights is too much, a ten-thousandth too little) do not apply to it."""
    try:
        return int(getattr(opt, "defaults", {}).get("max_iter", 1)) <= 1
    except (TypeError, ValueError, AttributeError):
        return True


def resumed_step(opt: torch.optim.Optimizer) -> int:
    """The steps ``opt`` took before this process watched it, by its own count: a state
    loaded from a checkpoint (``optimizer.load_state_dict``) holds them as ``step`` (Adam,
    AdamW, RMSprop, Adagrad and most others, per parameter; some per group). 0 for a fresh
    optimizer, and for one that keeps no count (SGD's momentum buffers, LBFGS).

    Read once, at a monitor's first step: a count kept on an accelerator (a fused or
    capturable Adam) costs one host sync there, never again."""
    for group in opt.param_groups:
        for p in group.get("params", ()):
            st = opt.state.get(p)  # a defaultdict: get() adds nothing
            if st and "step" in st:
                return _count(st["step"])
    return _count(opt.param_groups[0].get("step")) if opt.param_groups else 0


def _count(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else None
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 1:
        return int(value)
    return 0
