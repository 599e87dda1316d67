"""Fused per-group statistics over many tensors, without host-device synchronisation.

Tensors are bucketed by (device, dtype) so each bucket is one ``torch._foreach_norm``
call; per-tensor results are folded into per-group sums with one ``index_add_`` on the
device. Nothing here reads a value back to the host.

Sharded parameters (DTensor, as FSDP2's ``fully_shard`` makes them) are read through
their local shard, with no collective: each rank's sums cover what it holds, and the
engine adds the ranks' sums up (see :func:`shard_plan` for replicated placements).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sentinel.instrument.registry import stepper

Tensor = torch.Tensor


def device_index(values: Sequence[int], device: torch.device | str) -> Tensor:
    """A long index tensor on ``device`` with no sync: ``torch.tensor(..., device=cuda)``
    copies from the host and waits for the copy (a sync, once per new index); built on
    the host and copied with ``non_blocking=True``, the copy is only queued."""
    idx = torch.tensor(list(values), dtype=torch.long)
    return idx if torch.device(device).type == "cpu" else idx.to(device, non_blocking=True)


def _dtensor_type() -> type | None:
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - builds without DTensor
        return None
    return DTensor


def _local(t: Tensor) -> Tensor:
    """The local shard of a DTensor (the tensor itself otherwise); no communication.

    ``_local_tensor`` rather than ``to_local()``: the latter is an autograd Function, a
    few microseconds per call, paid per parameter per step on the hot path."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def shard_plan(params: Sequence[Tensor], rank: int) -> tuple[bool, list[bool]]:
    """Whether the parameters are sharded, and which of them this rank counts.

    The ranks' sums are added up by the engine, so each element of the model must be
    counted on exactly one rank:

    - a DTensor counts its local shard on the ranks whose coordinate is 0 on every mesh
      dimension where it is *not* sharded (``Replicate``, e.g. HSDP's replica dimension):
      the replicas hold the same values, and counting them on every rank would multiply
      the norm by the square root of the replica count;
    - in a run with DTensors, a plain tensor (a parameter left outside ``fully_shard``)
      is taken to be replicated and counts on global rank 0 only.

    Args:
        params: the watched parameters.
        rank: this process's global rank.

    Returns:
        ``(sharded, keep)``: ``sharded`` is True when any parameter is a DTensor;
        ``keep[i]`` says whether ``params[i]`` counts on this rank.
    """
    dtensor = _dtensor_type()
    if dtensor is None or not any(isinstance(p, dtensor) for p in params):
        return False, [True] * len(params)
    keep = []
    for p in params:
        if not isinstance(p, dtensor):
            keep.append(rank == 0)
            continue
        d: Any = p
        coord = d.device_mesh.get_coordinate()
        keep.append(coord is not None and all(
            c == 0 for c, pl in zip(coord, d.placements) if not pl.is_shard()))
    return True, keep


def _norms(tensors: list[Tensor], ord: float) -> Sequence[Tensor]:
    """Per-tensor norms as float32, for every dtype torch trains in (the norm of a complex
    tensor is real): low-precision tensors are accumulated in float32 (an fp16 norm
    overflows at 65504); float32 and complex64 ones take the plain, faster kernel; float64
    and complex128 ones are taken in their own precision and narrowed after."""
    dtype = tensors[0].dtype
    if dtype in (torch.float32, torch.complex64):
        return torch._foreach_norm(tensors, ord)
    if dtype in (torch.float64, torch.complex128):
        return torch.stack(torch._foreach_norm(tensors, ord)).to(torch.float32).unbind()
    return torch._foreach_norm(tensors, ord, dtype=torch.float32)


# On the CPU, cache-sized pieces: a chunk of tensors read by one kernel is still in the
# cache (32 MiB of L3 here) when the next kernel reads it again.
_CPU_CHUNK_BYTES = 4 << 20
_CPU_SCRATCH_ELEMS = 1 << 18  # 1 MiB of float32


def _cpu_l1(tensors: list[Tensor], scratch: Tensor) -> list[Tensor]:
    """Per-tensor ``sum(|t|)`` in float32 on the CPU, through a small reused scratch buffer.

    The CPU's L1-norm kernel is a scalar loop (4x slower than its L2 kernel on this
    model's gradients); ``abs`` into a cache-resident buffer and ``sum`` are vectorised and
    allocate nothing. The tensors are never written."""
    out: list[Tensor] = []
    n_max = scratch.numel()
    for t in tensors:
        flat = t.reshape(-1)  # a view of a contiguous tensor
        n = flat.numel()
        if n <= n_max:
            out.append(_abs_into(flat, scratch[:n]).sum())
            continue
        parts = [_abs_into(flat[i: i + n_max], scratch[:min(n_max, n - i)]).sum() for i in range(0, n, n_max)]
        out.append(torch.stack(parts).sum())
    return out


def _abs_into(src: Tensor, dst: Tensor) -> Tensor:
    """``|src|`` into the float32 ``dst`` (a low-precision ``src`` is widened first, a
    float64 one narrowed; a complex one's modulus is taken)."""
    if src.dtype == dst.dtype or src.is_complex():
        return torch.abs(src, out=dst)
    return dst.copy_(src).abs_()


def _chunks(tensors: Sequence[Tensor], device: torch.device) -> list[slice]:
    """Consecutive runs of tensors of about ``_CPU_CHUNK_BYTES`` on the CPU; one run elsewhere
    (a fused kernel per list is what a GPU wants)."""
    if device.type != "cpu":
        return [slice(0, len(tensors))]
    out, start, size = [], 0, 0
    for i, t in enumerate(tensors):
        size += t.numel() * t.element_size()
        if size >= _CPU_CHUNK_BYTES:
            out.append(slice(start, i + 1))
            start, size = i + 1, 0
    if start < len(tensors):
        out.append(slice(start, len(tensors)))
    return out


class _Bucket:
    __slots__ = ("params", "groups", "device", "_index_cache", "sparse", "_all", "_scratch", "fresh")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.params: list[Tensor] = []
        self.groups: list[int] = []
        self._index_cache: dict[tuple[int, ...], Tensor] = {}
        self.sparse: bool | None = None
        self._all: tuple[int, ...] | None = None
        self._scratch: Tensor | None = None
        # parameter norms computed alongside the update ratio, for the param_sumsq that
        # follows in the same hook: position -> (norm, the tensor's version when read)
        self.fresh: dict[int, tuple[Tensor, int]] = {}

    def scratch(self) -> Tensor:
        """A float32 buffer for :func:`_cpu_l1`, at most ``_CPU_SCRATCH_ELEMS`` long."""
        if self._scratch is None:
            n = min(_CPU_SCRATCH_ELEMS, max(1, *(p.numel() for p in self.params)))
            self._scratch = torch.empty(n, dtype=torch.float32, device=self.device)
        return self._scratch

    @property
    def all_positions(self) -> tuple[int, ...]:
        if self._all is None or len(self._all) != len(self.params):
            self._all = tuple(range(len(self.params)))
        return self._all

    def index(self, positions: tuple[int, ...]) -> Tensor:
        """Group index tensor (on the bucket's device) for a subset of its params."""
        idx = self._index_cache.get(positions)
        if idx is None:
            if len(self._index_cache) > 16:  # grads appearing and disappearing: keep it bounded
                self._index_cache.clear()
            idx = device_index([self.groups[i] for i in positions], self.device)
            self._index_cache[positions] = idx
        return idx


class GroupedTensors:
    """A fixed set of parameters with a group index each, bucketed for fused kernels.

    Args:
        params: the parameters, in a stable order.
        groups: group index of each parameter, ``0 <= g < n_groups``.
        n_groups: number of groups.
        sharded: the parameters may be DTensors: read their local shards.
    """

    def __init__(self, params: Sequence[Tensor], groups: Sequence[int], n_groups: int,
                 sharded: bool = False) -> None:
        self.n_groups = n_groups
        self.sharded = sharded
        self.buckets: dict[tuple[torch.device, torch.dtype], _Bucket] = {}
        for p, g in zip(params, groups):
            key = (p.device, p.dtype)
            b = self.buckets.get(key)
            if b is None:
                b = self.buckets[key] = _Bucket(p.device)
            b.params.append(p)
            b.groups.append(g)
        self.devices = sorted({k[0] for k in self.buckets}, key=str)
        self.param_bytes = sum(p.numel() * p.element_size() for p in params)

    def _grads(self, b: _Bucket) -> tuple[list[Tensor], tuple[int, ...]]:
        grads = [p.grad for p in b.params]
        if self.sharded:
            grads = [None if g is None else _local(g) for g in grads]
        if any(g is None for g in grads):  # not `None in grads`: that calls Tensor.__eq__
            pos = tuple(i for i, g in enumerate(grads) if g is not None)
            present: list[Tensor] = [g for g in grads if g is not None]
        else:
            pos, present = b.all_positions, grads  # type: ignore[assignment]
        if b.sparse is None:  # sparse grads (nn.Embedding(sparse=True)) stay sparse: check once
            b.sparse = any(g.is_sparse for g in present)
        if b.sparse:
            present = [g.coalesce()._values() if g.is_sparse else g for g in present]
        return present, pos

    def _fold(self, out: dict[torch.device, Tensor], b: _Bucket, norms: Sequence[Tensor],
              pos: tuple[int, ...], square: bool) -> None:
        if not norms:
            return
        self.add_at(out, b.device, norms, b.index(pos), square)

    def add_at(self, out: dict[torch.device, Tensor], device: torch.device, values: Sequence[Tensor],
               index: Tensor, square: bool) -> None:
        """Add 0-d ``values`` (squared first with ``square``) into ``out[device]``, the
        per-group vector, at the groups ``index`` names."""
        v = torch.stack(values)  # type: ignore[arg-type]
        if square:
            v.square_()
        acc = out.get(device)
        if acc is None:
            acc = out[device] = torch.zeros(self.n_groups, dtype=torch.float32, device=device)
        acc.index_add_(0, index, v)

    def grad_sums(self, l1: bool = False) -> tuple[dict[torch.device, Tensor], dict[torch.device, Tensor], int]:
        """Per-group ``sum(g**2)`` of the grads and, with ``l1``, ``sum(|g|)`` (the SNR's).

        The L1 sums come from the same read of the gradients: on the CPU the gradients go
        in pieces that stay in the cache between the two kernels, so memory is read once
        (on the 6M-parameter reference model the L1 sums added 2.4 ms to the step as a
        second full read, 1.6 ms in pieces); elsewhere one fused kernel per norm.

        Returns:
            Per device, one float32 vector of length ``n_groups`` of the squared sums and
            one of the L1 sums (empty without ``l1``), and the number of gradient elements
            the L1 sums saw (a host-side count; 0 without ``l1``).
        """
        sq: dict[torch.device, Tensor] = {}
        abs_sums: dict[torch.device, Tensor] = {}
        count = 0
        for b in self.buckets.values():
            b.fresh = {}  # before a step: parameter norms read after the last one are stale
            grads, pos = self._grads(b)
            if not grads:
                continue
            if not l1:
                self._fold(sq, b, _norms(grads, 2.0), pos, True)
                continue
            count += sum(g.numel() for g in grads)
            if b.device.type != "cpu":
                self._fold(sq, b, _norms(grads, 2.0), pos, True)
                self._fold(abs_sums, b, _norms(grads, 1.0), pos, False)
                continue
            norms: list[Tensor] = []
            sums: list[Tensor] = []
            for c in _chunks(grads, b.device):
                norms += _norms(grads[c], 2.0)
                sums += _cpu_l1(grads[c], b.scratch())
            self._fold(sq, b, norms, pos, True)
            self._fold(abs_sums, b, sums, pos, False)
        return sq, abs_sums, count

    def param_sumsq(self, only: set[int] | None = None) -> dict[torch.device, Tensor]:
        """Per-group ``sum(w**2)``, optionally only for parameters at positions in a group set.

        The norms of the parameters that :meth:`~sentinel.instrument.deltas.UpdateSnapshot.measure` has just read
        (and that no in-place op has changed since) are taken from that pass, not read again.
        """
        out: dict[torch.device, Tensor] = {}
        for b in self.buckets.values():
            fresh, b.fresh = b.fresh, {}
            pos = tuple(i for i, g in enumerate(b.groups) if only is None or g in only)
            if not pos:
                continue
            ps = [b.params[i] for i in pos]
            if self.sharded:
                ps = [_local(p) for p in ps]
            norms: list[Tensor | None] = [None] * len(pos)
            if fresh:
                for j, (i, p) in enumerate(zip(pos, ps)):
                    hit = fresh.get(i)
                    if hit is not None and hit[1] == p._version:
                        norms[j] = hit[0]
            missing = [j for j, n in enumerate(norms) if n is None]
            if missing:
                for j, n in zip(missing, _norms([ps[j] for j in missing], 2.0)):
                    norms[j] = n
            self._fold(out, b, norms, pos, True)  # type: ignore[arg-type]  # all filled
        return out


def adam_saturation(optimizers: Sequence[torch.optim.Optimizer], threshold: float,
                    max_tensors: int, cursor: int) -> tuple[dict[torch.device, Tensor], int, int]:
    """Sampled count of ``exp_avg_sq`` entries above ``threshold``.

    Looks at up to ``max_tensors`` state tensors starting at ``cursor`` (rotating); of a
    DTensor (FSDP2, tensor parallelism), its local shard: what this rank holds, with no
    communication. (A tensor-parallel block beside a plain LayerNorm mixed DTensor and
    plain counts, and the step's report failed.)

    Returns:
        Per-device 1-element count tensors, the number of entries looked at (host),
        and the next cursor.
    """
    tensors = [_local(st["exp_avg_sq"]) for opt in optimizers for st in stepper(opt).state.values()
               if isinstance(st.get("exp_avg_sq"), torch.Tensor)]
    if not tensors:
        return {}, 0, 0
    cursor %= len(tensors)
    chosen = (tensors + tensors)[cursor: cursor + min(max_tensors, len(tensors))]
    out: dict[torch.device, Tensor] = {}
    total = 0
    for t in chosen:
        flat = (torch.view_as_real(t) if t.is_complex() else t).detach().reshape(-1)  # complex: Adam's real view
        stride = max(1, flat.numel() // 65536)
        sample = flat[::stride]
        total += sample.numel()
        c = (sample > threshold).sum(dtype=torch.float32).reshape(1)
        out[t.device] = c if t.device not in out else out[t.device] + c
    return out, total, (cursor + len(chosen)) % len(tensors)
