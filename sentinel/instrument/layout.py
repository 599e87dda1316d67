"""What a monitor reads: the optimizers' trainable parameters, grouped and bucketed.

A layout is built at ``watch()`` and built again when what the optimizers step changes:
a param group added with ``add_param_group``, a parameter that starts (or stops)
requiring grad, an optimizer re-created mid-run. :meth:`Layout.changed` tells, at a cost
of a few attribute reads per step: the number of param groups and of parameters per
optimizer, the ``requires_grad`` flags of the parameters that were frozen (none in most
runs), and now and then those of the trainable ones (a script that freezes more later).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sentinel.instrument.deltas import UpdateSnapshot
from sentinel.instrument.groups import assign_groups
from sentinel.instrument.optinfo import one_update_a_step
from sentinel.instrument.stats import GroupedTensors, _local, shard_plan


def _signature(opt: torch.optim.Optimizer) -> tuple[int, ...]:
    return tuple(len(g["params"]) for g in opt.param_groups)


class Layout:
    """Groups, fused-statistics buckets and update snapshots for a set of optimizers.

    Args:
        names: parameter name by ``id(param)``, from the model (may be empty).
        optimizers: the real optimizers, in a stable order.
        rank: this process's global rank (sharded runs count replicated tensors once).
        group_depth, max_groups: see :func:`~sentinel.instrument.groups.assign_groups`.
        snapshot_bytes: the update-ratio snapshot budget per optimizer.
        loose: ids of the parameters no module holds (:func:`~sentinel.instrument.naming.parameter_names`):
            no update size is taken of the single-element ones (:attr:`coefficients`).
    """

    def __init__(self, names: dict[int, str], optimizers: Sequence[torch.optim.Optimizer], rank: int,
                 group_depth: int | str, max_groups: int, snapshot_bytes: int,
                 loose: set[int] | frozenset[int] = frozenset()) -> None:
        per_opt: list[list[tuple[str, torch.Tensor]]] = []
        self.frozen: list[torch.Tensor] = []
        self.trainable: list[torch.Tensor] = []
        for k, opt in enumerate(optimizers):
            plist = []
            for gi, group in enumerate(opt.param_groups):
                for pi, p in enumerate(group["params"]):
                    if p.requires_grad:
                        plist.append((names.get(id(p), f"optimizer{k}.group{gi}.{pi}"), p))
                        self.trainable.append(p)
                    else:
                        self.frozen.append(p)
            per_opt.append(plist)
        self._signatures = [_signature(opt) for opt in optimizers]
        all_names = [n for plist in per_opt for n, _ in plist]
        self.groups, assignment = assign_groups(all_names, group_depth, max_groups)
        gmap = dict(zip(all_names, assignment))
        # groups come from every name, so all ranks of a sharded run list the same groups
        self.sharded, keep = shard_plan([p for pl in per_opt for _, p in pl], rank)
        kept = iter(keep)
        per_opt = [[(n, p) for n, p in pl if next(kept)] for pl in per_opt]
        self.tensors = [GroupedTensors([p for _, p in pl], [gmap[n] for n, _ in pl], len(self.groups),
                                       self.sharded) for pl in per_opt]
        # no update size for LBFGS, whose step is many updates (optinfo.one_update_a_step),
        # nor of a loose scalar: a coefficient, with no weight's scale to be measured against
        # (SAC's log_alpha starts at 0: each of its first updates is about all of it)
        scalars = {id(p) for p in self.trainable if id(p) in loose and p.numel() == 1}
        self.snapshots = [UpdateSnapshot(t, snapshot_bytes, one_update_a_step(opt), scalars)
                          for t, opt in zip(self.tensors, optimizers)]
        self.coefficients = bool(self.trainable) and len(scalars) == len(self.trainable)
        """The optimizers step only loose scalars: coefficients (SAC's entropy temperature, a
        Lagrange multiplier), whose loss is no training loss (the scalar ``objective``)."""
        # this rank's bytes (its shards under FSDP2), beside the state bytes it holds
        self.param_bytes = sum(_local(p).numel() * p.element_size() for p in self.trainable)
        self.devices = sorted({d for t in self.tensors for d in t.devices}, key=str)

    @property
    def params(self) -> list[torch.Tensor]:
        """Every parameter the optimizers step, trainable or not."""
        return self.trainable + self.frozen

    def changed(self, optimizers: Sequence[torch.optim.Optimizer], full: bool) -> bool:
        """Whether the optimizers now step other parameters than this layout holds.

        A frozen parameter that starts requiring grad is seen at once, so its first
        gradient counts; with ``full``, also a trainable one that was frozen since (its
        gradient is None from then on and counts nowhere anyway; only the parameter norms
        still include it until this check).
        """
        if len(optimizers) != len(self._signatures):
            return True
        for opt, sig in zip(optimizers, self._signatures):
            if _signature(opt) != sig:
                return True
        if any(p.requires_grad for p in self.frozen):
            return True
        return full and not all(p.requires_grad for p in self.trainable)
