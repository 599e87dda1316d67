"""What a monitor reads: the optimizers' trainable parameters, grouped and bucketed.

A layout is built at ``watch()`` and built again when what the optimizers step changes:
a param group added with ``add_param_group``, a parameter that starts (or stops)
requiring grad, an optimizer re-created mid-run. :meth:`Layout.changed_at` tells, at a cost
of a few attribute reads per step: the number of param groups and of parameters per
optimizer, the ``requires_grad`` flags of the parameters that were frozen (none in most
runs), and now and then those of the trainable ones (a script that freezes more later).

Each optimizer's parameters are judged at that optimizer's own step (:meth:`Layout.changed_at`):
a script with several optimizers may turn the others' ``requires_grad`` off for each one's
step and on again for theirs (Lightning's ``toggle_optimizer`` in manual optimization,
pix2pix's and WGAN's ``set_requires_grad``). At the first optimizer's step the second's
parameters are frozen, and only for that moment: a layout built then keeps what each other
optimizer's parameters were at its own last step (``known``), so the discriminator's
gradients are read at its step. A change an optimizer other than the step's first shows is
taken into a new layout at the next step's first (the layout's groups must not change
within a step).
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
                 loose: set[int] | frozenset[int] = frozenset(),
                 known: Sequence[dict[int, bool] | None] = ()) -> None:
        per_opt: list[list[tuple[str, torch.Tensor]]] = []
        self.frozen: list[torch.Tensor] = []
        self.trainable: list[torch.Tensor] = []
        self._frozen_of: list[list[torch.Tensor]] = []
        self._trainable_of: list[list[torch.Tensor]] = []
        for k, opt in enumerate(optimizers):
            plist = []
            wants = known[k] if k < len(known) else None  # requires_grad by id at its own last step
            frozen: list[torch.Tensor] = []
            for gi, group in enumerate(opt.param_groups):
                for pi, p in enumerate(group["params"]):
                    if p.requires_grad if wants is None else wants.get(id(p), p.requires_grad):
                        plist.append((names.get(id(p), f"optimizer{k}.group{gi}.{pi}"), p))
                    else:
                        frozen.append(p)
            per_opt.append(plist)
            self._trainable_of.append([p for _, p in plist])
            self._frozen_of.append(frozen)
            self.trainable += self._trainable_of[-1]
            self.frozen += frozen
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

    @property
    def count(self) -> int:
        """How many optimizers it holds."""
        return len(self._signatures)

    def changed_at(self, k: int, opt: torch.optim.Optimizer, full: bool) -> bool:
        """Whether optimizer ``k``, at its step, steps other parameters than this layout
        holds for it.

        A frozen parameter that starts requiring grad is seen at once, so its first
        gradient counts (at once for the step's first optimizer; from the next step for
        the others); with ``full``, also a trainable one that was frozen since (its
        gradient is None from then on and counts nowhere anyway; only the parameter norms
        still include it until this check).
        """
        if k >= len(self._signatures) or _signature(opt) != self._signatures[k]:
            return True
        if any(p.requires_grad for p in self._frozen_of[k]):
            return True
        return full and not all(p.requires_grad for p in self._trainable_of[k])

    def known(self, k: int) -> dict[int, bool]:
        """Optimizer ``k``'s parameters' ``requires_grad`` as this layout took them, by id."""
        if k >= len(self._signatures):
            return {}
        return {**{id(p): False for p in self._frozen_of[k]}, **{id(p): True for p in self._trainable_of[k]}}
