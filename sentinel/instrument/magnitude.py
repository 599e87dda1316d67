"""L1 sums for the seed's update ratio, UAR = mean|Δw| / mean|w| (seed 000 §4.4).

Over the same elements the means' counts cancel, so per group the frame carries
``sum|w_old|`` (taken before the step, over the groups the update snapshot sampled) and
``sum|w_old - w_new|`` (after it, from the snapshot's deltas), and the engine divides.
Both are fused ``_foreach_norm(ord=1)`` kernels folded per group on the device, with the
same buckets as every other statistic; nothing is read back here.

The deltas are the snapshot buffers that :meth:`UpdateSnapshot.delta_sumsq` turns into
``w_old - w_new`` in place: :func:`pending` takes hold of them before that call and
:func:`delta_l1` reads them after it, so the snapshot itself is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sentinel.instrument.stats import GroupedTensors, UpdateSnapshot, _local, _norms

Tensor = torch.Tensor


def param_l1(tensors: GroupedTensors, groups: set[int]) -> dict[torch.device, Tensor]:
    """Per-group ``sum(|w|)`` of the parameters in ``groups`` (call before the step)."""
    out: dict[torch.device, Tensor] = {}
    if not groups:
        return out
    for b in tensors.buckets.values():
        pos = tuple(i for i, g in enumerate(b.groups) if g in groups)
        if pos:
            ps = [b.params[i] for i in pos]
            if tensors.sharded:
                ps = [_local(p) for p in ps]
            tensors._fold(out, b, _norms(ps, 1.0), pos, False)
    return out


def pending(snap: UpdateSnapshot) -> Sequence[Any]:
    """The snapshot's entries ``(bucket key, buffers, params, positions)`` of this step,
    before :meth:`UpdateSnapshot.delta_sumsq` consumes them (empty when the snapshot
    keeps none under that name)."""
    views = getattr(snap, "_views", None)
    return list(views) if isinstance(views, list) else []


def delta_l1(tensors: GroupedTensors, entries: Sequence[Any]) -> dict[torch.device, Tensor]:
    """Per-group ``sum(|w_old - w_new|)`` from entries :func:`pending` took, once
    ``delta_sumsq`` has turned their buffers into the deltas."""
    out: dict[torch.device, Tensor] = {}
    for entry in entries:
        key, views, _, pos = entry
        if views:
            tensors._fold(out, tensors.buckets[key], _norms(list(views), 1.0), tuple(pos), False)
    return out
