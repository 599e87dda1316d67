"""The update's size from one sampled snapshot: ‖Δw‖, the L2 ratio and the seed's UAR.

Before a sampled step :meth:`UpdateSnapshot.take` copies a rotating subset of groups into
flat buffers; after it :meth:`UpdateSnapshot.measure` reads, per group and in one pass:

- ``delta_sumsq``: ``sum((w_old - w_new)**2)``, for ‖Δw‖ and ‖Δw‖/‖w‖;
- ``delta_l1`` and ``param_l1``: ``sum|w_old - w_new|`` and ``sum|w_old|``, for the seed's
  UAR = mean|Δw| / mean|w| (seed 000 §4.4): over the same elements the means' counts
  cancel, so the frame carries the two sums and the engine divides;
- the parameters' own norms, which the step's
  :meth:`~sentinel.instrument.stats.GroupedTensors.param_sumsq` then uses instead of
  reading the weights again.

Cost. The buffer is turned into the deltas in place (``w_old - w_new``, then
``|w_old - w_new|``), so nothing is allocated per step. On the CPU the sampled tensors lie
end to end in the buffer and go through the passes a piece at a time (:class:`_Piece`),
each piece's norm and sum one flat kernel, ``sum|w_old|`` through a small scratch (torch's
CPU L1-norm kernel is a scalar loop, 2.5x slower than ``abs`` + ``sum``): after an
optimizer step has flushed the caches, the weights and the buffer then come from memory
once, not once per figure. On the 6M-parameter reference model a sample costs 7–8 ms,
copy included, where a kernel per figure over all tensors took 11–12 ms. Elsewhere (a GPU)
each figure is one fused ``_foreach_norm`` over the tensors.
Nothing is read back here.
"""

from __future__ import annotations

from typing import Any

import torch

from sentinel.instrument.stats import GroupedTensors, _abs_into, _local, _norms, device_index

Tensor = torch.Tensor
_Key = tuple[torch.device, torch.dtype]


# A piece of the buffer and of the weights it copies stays in the L3 cache between the
# passes over it (4 MiB of float32 each, here 32 MiB of L3): the weights and the buffer
# come from memory once per sampled step instead of once per pass.
_PIECE_ELEMS = 1 << 20


class _Piece:
    """A contiguous slice of the buffer within one group, and the slices of the weights it
    copies (a weight larger than a piece is cut across pieces)."""

    __slots__ = ("flat", "bufs", "params", "owners", "group")

    def __init__(self, flat: Tensor, bufs: list[Tensor], params: list[Tensor], owners: list[int], group: int) -> None:
        self.flat, self.bufs, self.params, self.owners, self.group = flat, bufs, params, owners, group


class _Sample:
    """One bucket's share of a snapshot: the buffer's views, the parameters they copy and
    their positions in the bucket; on the CPU, the buffer cut into :class:`_Piece` s."""

    __slots__ = ("key", "views", "params", "pos", "ptrs", "pieces", "piece_index")
    piece_index: Tensor | None

    def __init__(self, key: _Key, flat: Tensor, views: list[Tensor], params: list[Tensor],
                 pos: list[int], groups: list[int]) -> None:
        self.key, self.views, self.params, self.pos = key, views, params, pos
        self.ptrs = [p.data_ptr() for p in params]
        self.pieces: list[_Piece] = []
        # the CPU pass takes deltas in a real float32 scratch: complex weights take the
        # per-tensor path, whose norms are of the moduli
        if key[0].type == "cpu" and not key[1].is_complex and all(p.is_contiguous() for p in params):
            self._cut(flat, groups)
        self.piece_index = device_index([c.group for c in self.pieces], key[0]) \
            if self.pieces else None

    def _cut(self, flat: Tensor, groups: list[int]) -> None:
        cur: _Piece | None = None
        off = 0
        for j, p in enumerate(self.params):
            g, src, n, done = groups[self.pos[j]], p.reshape(-1), p.numel(), 0
            while done < n:
                if cur is None or cur.group != g or cur.flat.numel() >= _PIECE_ELEMS:
                    cur = _Piece(flat[off + done: off + done], [], [], [], g)
                    self.pieces.append(cur)
                take = min(n - done, _PIECE_ELEMS - cur.flat.numel())
                start = off + done - cur.flat.numel()
                cur.flat = flat[start: off + done + take]
                cur.bufs.append(flat[off + done: off + done + take])
                cur.params.append(src[done: done + take])
                cur.owners.append(j)
                done += take
            off += n

    def current(self, params: list[Tensor]) -> bool:
        """Whether this sample still describes ``params`` (the same tensors and storage)."""
        return len(params) == len(self.params) and all(
            a is b and a.data_ptr() == q for a, b, q in zip(params, self.params, self.ptrs))


class UpdateSnapshot:
    """Bounded snapshot of parameters for the update's size.

    Each sampling step snapshots a rotating subset of groups whose bytes fit the budget
    (at least one group), into flat buffers reused across steps. Group bytes are the
    parameters' global sizes (a DTensor's ``numel()`` is global), so every rank of a
    sharded run samples the same groups at the same step and the engine can add them up.

    Args:
        tensors: the grouped parameters.
        budget: the most bytes the snapshot buffers may hold.
        enabled: False for an optimizer whose step is not one update (LBFGS:
            :func:`~sentinel.instrument.optinfo.one_update_a_step`): nothing is ever taken.
        skip: ids of parameters never taken (coefficients: single-element tensors no module
            holds, :attr:`~sentinel.instrument.layout.Layout.coefficients`): their groups'
            figures are of the others, and a group of them only is never sampled.
    """

    def __init__(self, tensors: GroupedTensors, budget: int, enabled: bool = True,
                 skip: set[int] | frozenset[int] = frozenset()) -> None:
        self.tensors = tensors
        self.budget = budget
        self.skip = skip
        gb = [0] * tensors.n_groups
        for b in tensors.buckets.values():
            for p, g in zip(b.params, b.groups):
                if id(p) not in skip:
                    gb[g] += p.numel() * p.element_size()
        self.group_bytes = gb
        held = {g for b in tensors.buckets.values() for p, g in zip(b.params, b.groups) if id(p) not in skip}
        self.eligible = sorted(held) if enabled else []  # the groups a snapshot rotates over
        self._cursor = 0
        self._buffers: dict[_Key, Tensor] = {}
        self._samples: list[_Sample] = []
        self._cache: dict[_Key, _Sample] = {}
        self._scratch: dict[torch.device, Tensor] = {}
        self.groups: set[int] = set()

    @property
    def buffer_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._buffers.values())

    def _choose(self) -> set[int]:
        eligible = self.eligible
        n = len(eligible)
        chosen: set[int] = set()
        if not n:
            return chosen
        used = 0
        for k in range(n):
            g = eligible[(self._cursor + k) % n]
            if chosen and used + self.group_bytes[g] > self.budget:
                break
            chosen.add(g)
            used += self.group_bytes[g]
        self._cursor = (self._cursor + len(chosen)) % n
        return chosen

    def take(self) -> None:
        """Copy the next subset of groups into the snapshot buffers (before the step)."""
        self.groups = chosen = self._choose()
        self._samples = []
        for key, b in self.tensors.buckets.items():
            b.fresh = {}
            pos = [i for i, g in enumerate(b.groups) if g in chosen and id(b.params[i]) not in self.skip]
            if not pos:
                continue
            params = [b.params[i] for i in pos]
            if self.tensors.sharded:
                params = [_local(p) for p in params]
            sample = self._sample(key, pos, params, b.groups)
            torch._foreach_copy_(sample.views, params)
            self._samples.append(sample)

    def _sample(self, key: _Key, pos: list[int], params: list[Tensor], groups: list[int]) -> _Sample:
        """Views of the bucket's flat buffer shaped like ``params``; kept while the same
        positions are sampled (every time, when the whole model fits the budget)."""
        cached = self._cache.get(key)
        if cached is not None and cached.pos == pos and cached.current(params):
            return cached
        need = sum(p.numel() for p in params)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < need:
            buf = self._buffers[key] = torch.empty(need, dtype=key[1], device=key[0])
        views, off = [], 0
        for p in params:
            views.append(buf[off: off + p.numel()].view_as(p))
            off += p.numel()
        sample = self._cache[key] = _Sample(key, buf[:need], views, params, pos, groups)
        return sample

    def measure(self) -> dict[str, dict[torch.device, Tensor]]:
        """Per-group ``delta_sumsq``, ``delta_l1`` and ``param_l1`` of the snapshot groups
        (after the step); the snapshot is spent."""
        out: dict[str, dict[torch.device, Tensor]] = {"delta_sumsq": {}, "delta_l1": {}, "param_l1": {}}
        for s in self._samples:
            b = self.tensors.buckets[s.key]
            if s.pieces:
                self._measure_pieces(out, s, b)
                continue
            pos = tuple(s.pos)
            norms = _norms(s.params, 2.0)  # the weights' own norms, for param_sumsq
            b.fresh = {i: (n, p._version) for i, p, n in zip(s.pos, s.params, norms)}
            self.tensors._fold(out["param_l1"], b, _norms(s.views, 1.0), pos, False)
            torch._foreach_sub_(s.views, s.params)
            self.tensors._fold(out["delta_sumsq"], b, _norms(s.views, 2.0), pos, True)
            self.tensors._fold(out["delta_l1"], b, _norms(s.views, 1.0), pos, False)
        self._samples = []
        return out

    def _measure_pieces(self, out: dict[str, dict[torch.device, Tensor]], s: _Sample, b: Any) -> None:
        """The CPU pass: every figure of a piece while it is cached, then on to the next."""
        dev = s.key[0]
        n = max(c.flat.numel() for c in s.pieces)
        scratch = self._scratch.get(dev)
        if scratch is None or scratch.numel() < n:
            scratch = self._scratch[dev] = torch.empty(n, dtype=torch.float32, device=dev)
        old, sq, l1 = [], [], []
        slices: list[list[Tensor]] = [[] for _ in s.params]  # each weight's slices' norms
        for c in s.pieces:
            work = scratch[:c.flat.numel()]
            old.append(_abs_into(c.flat, work).sum())
            for j, t in zip(c.owners, _norms(c.params, 2.0)):
                slices[j].append(t)
            off = 0  # w_old - w_new into the cached scratch: the big buffer is only read
            for buf, p in zip(c.bufs, c.params):
                d = work[off: off + buf.numel()]
                if buf.dtype == d.dtype:
                    torch.sub(buf, p, out=d)
                else:
                    d.copy_(buf).sub_(p)  # low precision: the delta in float32
                off += buf.numel()
            sq.append(torch.linalg.vector_norm(work, dtype=torch.float32))
            l1.append(work.abs_().sum())
        b.fresh = {i: (parts[0] if len(parts) == 1 else torch.linalg.vector_norm(torch.stack(parts)), p._version)
                   for i, p, parts in zip(s.pos, s.params, slices) if parts}  # an empty weight has none
        for name, values, square in (("param_l1", old, False), ("delta_sumsq", sq, True), ("delta_l1", l1, False)):
            self.tensors.add_at(out[name], dev, values, s.piece_index, square)  # type: ignore[arg-type]  # pieces: set
