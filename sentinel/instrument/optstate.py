"""A health figure for each of the seeds' six optimizers (seed 000 §2, §4.4), sampled.

Adam's state saturation (the fraction of ``exp_avg_sq`` above a threshold) lives in
:func:`sentinel.instrument.stats.adam_saturation`; it means something only for optimizers
whose ``exp_avg_sq`` is Adam's full second moment, so :func:`adam_like` picks those. The
others get their own figure, each a sampled count over a total, on the device:

=======================  =================================================================
``adafactor_saturation``  Adafactor: the fraction of the second moment above the threshold,
                          with the factored moment rebuilt as ``v = r ⊗ c / mean(r)`` (torch's
                          ``row_var``/``col_var``, pytorch-optimizer's ``exp_avg_sq_row/col``)
                          on a strided grid of at most 256 × 256 entries, and unfactored
                          states (torch's ``variance``, a 1-D ``exp_avg_sq``) sampled as is.
                          Cost: one outer product of ≤ 65,536 entries per tensor.
``lion_sign_agreement``   Lion: the fraction of sampled entries where the gradient's sign
                          equals its momentum's. The seed's SS for Lion, mean(|m| == 1),
                          rests on a wrong update rule (seed 000 §2.6 has m track sign(g);
                          Lion's m is an EMA of g and the *update* is a sign), so it is never
                          1. Agreement near 0.5 says each step's direction is a coin toss
                          (noise dominates); near 1, the steps agree. Read after the step,
                          where m holds (1 - β2) of the current gradient: a bias of ~1 %.
``sophia_clip_fraction``  Sophia: the fraction of entries whose step is clipped, |m| ≥
                          ρ · max(h, eps) (pytorch-optimizer's ``SophiaH``: ``p`` = ρ).
                          Near 1, Sophia degenerates into sign descent (Lion-like); near 0,
                          its curvature scaling does the work.
=======================  =================================================================

``sophia_hessian_mean`` (the Hessian estimate's scale, mean of the sampled ``hessian_moment``)
and LAMB's trust ratio per group (:func:`trust_ratios`) come beside them.

Like ``adam_saturation``: at most ``max_tensors`` state tensors per report, rotating with a
cursor, each read with a stride so at most 65,536 entries count. The counts stay on the
device (one-element tensors) and ride in the report's one readback; the totals are host
integers from shapes. Nothing is read back here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sentinel.instrument.registry import stepper
from sentinel.instrument.stats import _local, device_index

Tensor = torch.Tensor
SAMPLE = 65536
GRID = 256
_FACTORED = (("row_var", "col_var"), ("exp_avg_sq_row", "exp_avg_sq_col"))
_UNFACTORED = ("variance", "exp_avg_sq")


def _flat(t: Tensor, limit: int = SAMPLE) -> Tensor:
    flat = _local(t).detach().reshape(-1)  # a DTensor's shard, without communication
    return flat[:: max(1, flat.numel() // limit)]


def factored(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` is Adafactor-like (factored second moments, or its class says so)."""
    if type(stepper(opt)).__name__.lower() == "adafactor":
        return True
    return any(r in st for st in stepper(opt).state.values() for r, _ in _FACTORED)


def adam_like(optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
    """The optimizers whose ``exp_avg_sq`` is Adam's full second moment (not Adafactor's
    unfactored leftovers, whose saturation would describe the biases alone)."""
    return [o for o in optimizers if not factored(o)]


class _Acc:
    def __init__(self) -> None:
        self.num: dict[str, dict[torch.device, Tensor]] = {}
        self.total: dict[str, int] = {}

    def add(self, name: str, count: Tensor, total: int) -> None:
        per = self.num.setdefault(name, {})
        c = count.to(torch.float32).reshape(1)
        per[c.device] = per[c.device] + c if c.device in per else c
        self.total[name] = self.total.get(name, 0) + total


def _adafactor(acc: _Acc, st: dict[str, Any], threshold: float) -> bool:
    for rk, ck in _FACTORED:
        r, c = st.get(rk), st.get(ck)
        if isinstance(r, Tensor) and isinstance(c, Tensor):
            rf, cf = _local(r).detach().float().reshape(-1), _local(c).detach().float().reshape(-1)
            mean = rf.mean().clamp_min(1e-30)
            rs, cs = rf[:: max(1, rf.numel() // GRID)], cf[:: max(1, cf.numel() // GRID)]
            v = torch.outer(rs, cs) / mean
            acc.add("adafactor_saturation", (v > threshold).sum(), v.numel())
            return True
    for key in _UNFACTORED:
        t = st.get(key)
        if isinstance(t, Tensor) and t.numel() > 0:
            s = _flat(t)
            acc.add("adafactor_saturation", (s > threshold).sum(), s.numel())
            return True
    return False


def health(optimizers: Sequence[torch.optim.Optimizer], threshold: float, max_tensors: int,
           cursor: int) -> tuple[dict[str, dict[torch.device, Tensor]], dict[str, int], int]:
    """The sampled figures of the module docstring.

    Args:
        threshold: the saturation threshold (the same as Adam's).
        max_tensors: state entries (one parameter's state each) looked at per call.
        cursor: where the rotation starts.

    Returns:
        Per figure, its per-device one-element numerator; per figure, the host total (the
        figure is their ratio; for ``sophia_hessian_mean`` a mean); the next cursor.
    """
    entries: list[tuple[str, Tensor, dict[str, Any], dict[str, Any]]] = []
    for opt in optimizers:
        steps = stepper(opt)
        name = type(steps).__name__
        kind = ("adafactor" if factored(opt) else "lion" if name == "Lion"
                else "sophia" if name.startswith("Sophia") else "")
        if not kind:
            continue
        for g in opt.param_groups:
            for p in g["params"]:
                st = steps.state.get(p)
                if st:
                    entries.append((kind, p, st, g))
    acc = _Acc()
    if not entries:
        return {}, {}, 0
    cursor %= len(entries)
    chosen = (entries + entries)[cursor: cursor + min(max_tensors, len(entries))]
    for kind, p, st, g in chosen:
        if kind == "adafactor":
            _adafactor(acc, st, threshold)
        elif kind == "lion":
            m, grad = st.get("exp_avg"), p.grad
            if isinstance(m, Tensor) and isinstance(grad, Tensor) and not grad.is_sparse:
                ms, gs = _flat(m), _flat(grad)
                if ms.numel() == gs.numel():
                    acc.add("lion_sign_agreement", (torch.sign(ms) * torch.sign(gs) > 0).sum(), ms.numel())
        else:
            m, h = st.get("momentum"), st.get("hessian_moment")
            rho, eps = g.get("p", 0.01), g.get("eps", 1e-12)
            if isinstance(m, Tensor) and isinstance(h, Tensor) and isinstance(rho, (int, float)):
                ms, hs = _flat(m), _flat(h)
                clipped = ms.abs() >= float(rho) * hs.clamp_min(float(eps))
                acc.add("sophia_clip_fraction", clipped.sum(), ms.numel())
                acc.add("sophia_hessian_mean", hs.float().sum(), hs.numel())
    return acc.num, acc.total, (cursor + len(chosen)) % len(entries)


def trust_ratios(opt: torch.optim.Optimizer, group_of: dict[int, int],
                 n_groups: int) -> tuple[dict[torch.device, Tensor], list[int]]:
    """LAMB's trust ratio ‖w‖/‖update‖ per group: the sum of the ratios its step left in
    each parameter's state (``trust_ratio``, one-element tensors on the device; plain floats
    count too), and how many parameters each group sums (host). The mean is their ratio.

    Args:
        group_of: ``id(param) → group index``.
    """
    sums: dict[torch.device, Tensor] = {}
    counts = [0] * n_groups
    by_dev: dict[torch.device, tuple[list[Tensor], list[int]]] = {}
    state = stepper(opt).state
    for g in opt.param_groups:
        for p in g["params"]:
            st = state.get(p)
            k = group_of.get(id(p))
            if not st or k is None or "trust_ratio" not in st:
                continue
            tr = st["trust_ratio"]
            t = _local(tr).detach().reshape(1).float() if isinstance(tr, Tensor) else torch.tensor([float(tr)])
            vals, idx = by_dev.setdefault(t.device, ([], []))
            vals.append(t)
            idx.append(k)
            counts[k] += 1
    for dev, (vals, idx) in by_dev.items():
        acc = torch.zeros(n_groups, dtype=torch.float32, device=dev)
        acc.index_add_(0, device_index(idx, dev), torch.cat(vals))
        sums[dev] = acc
    return sums, counts
