"""Global norms of sharded runs (FSDP2 / DTensor), assembled from the ranks' sums of squares.

A rank of a sharded run holds a slice of each parameter, so its sums of squares cover
only that slice: the norm of the model is ``sqrt(sum over ranks)``. Ranks send the sums
(frames marked ``shard: "sharded"``, see :mod:`sentinel.wire`); this module collects the
frames of all ``world`` ranks of a run for one step and writes the whole model's series,
with no collective in training.

Series, for a Prometheus/Grafana user:

- ``sentinel_grad_norm``, ``sentinel_group_grad_norm``, ``sentinel_param_norm``,
  ``sentinel_group_param_norm``, ``sentinel_update_ratio``, ``sentinel_group_update_ratio``,
  ``sentinel_gradient_variance_ratio`` and ``sentinel_gradient_snr`` keep their meaning:
  the **whole model's** values. Once a step is assembled they are written under *every*
  rank's labels, each with that rank's own step and time, exactly as DDP ranks each report
  the (replicated) global norm. Dashboards, PromQL and the rule pack therefore read DDP and
  FSDP runs alike, and a cross-rank comparison of ``sentinel_grad_norm`` sees equal values.
  Why not a single ``rank="all"`` series: the rule engine judges the series of the rank
  whose frame it just ingested, keyed by an integer rank; a series of no rank would never
  be judged. With every rank's copy written, the rules of the rank whose frame completes
  the step judge the assembled sample right after this frame.
- ``sentinel_local_grad_norm`` and ``sentinel_local_group_grad_norm``: each rank's own
  shard, written at once. They are *not* the model's norm; across nodes (one daemon per
  node sees only its own ranks, so it cannot assemble) the global norm is
  ``sqrt(sum by (job, run) (sentinel_local_grad_norm ^ 2))`` in PromQL.
- Non-finite sums are flagged per rank at once (a NaN in a shard is a NaN in the model).
- ``sentinel_optimizer_state_bytes`` and ``sentinel_param_bytes`` are each rank's own
  shards (what that rank's memory holds; their ratio is the optimizer's, 2 for Adam);
  ``sentinel_model_optimizer_state_bytes`` is the ranks' sum, the whole model's state,
  written under every rank's labels like the norms.

Each assembled step is also handed to the engine's ``assembled_listeners`` (the run
history records the model's norms from it, not from rank 0's shard sums), as the rules'
context's ``assembled`` list: the whole model's per-group sums, shaped like rank 0's step
frame (see :meth:`ShardAssembler.route`).

Memory is bounded: per run at most :data:`MAX_STEPS` steps wait for missing frames, and at
most :data:`MAX_RUNS` runs are tracked. A step still incomplete when a later step
completes, or pushed out by the bound, is dropped; each rank whose frame it held counts it
in ``sentinel_shard_steps_incomplete_total``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sentinel.engine.derived import GroupLabels, GvrTracker, write_update_ratios
from sentinel.engine.derived import sqrt as _sqrt
from sentinel.rules.ingested import Ingested
from sentinel.store import Labels, Store

MAX_STEPS = 8
"""Steps of one run that may wait for missing ranks' frames."""
MAX_RUNS = 64
"""Sharded runs tracked at once; the least recently seen is dropped beyond this."""
MAX_WORLD = 4096
"""Larger world sizes are not assembled (they span many nodes: see the module docstring)."""

_ADDITIVE = ("grad_sumsq", "param_sumsq", "delta_sumsq", "grad_l1", "grad_count")


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(slots=True)
class _Part:
    """One rank's additive values for one step."""

    base: Labels
    t: float
    groups: list[str]
    gsq: list[float]
    psq: list[float] | None
    dsq: list[Any] | None
    l1: float | None
    count: float | None
    state: dict[str, float] | None = None  # optimizer-state bytes of this rank's shards


def _norms(sumsq: np.ndarray) -> np.ndarray:
    """Square roots, NaN for a negative sum."""
    out = np.sqrt(np.abs(sumsq))
    out[sumsq < 0] = np.nan
    return out


def _by_group(parts: list[_Part], field: str, order: list[str]) -> np.ndarray | None:
    """Per-group sums over the ranks, by group name; None if some rank lacks the field."""
    rows = [getattr(p, field) for p in parts]
    if any(r is None for r in rows):
        return None
    if all(p.groups == order for p in parts):  # the usual case: every rank lists the same groups
        return np.asarray(rows, dtype=np.float64).sum(axis=0)
    acc = dict.fromkeys(order, 0.0)
    for p, vals in zip(parts, rows):
        for g, v in zip(p.groups, vals):
            acc[g] += float(v)
    return np.fromiter(acc.values(), dtype=np.float64, count=len(acc))


def _state(st: Any) -> dict[str, float] | None:
    """A frame's ``state_bytes`` (sent at the first step and every ``state_every``), or None."""
    if not isinstance(st, dict) or not all(_num(v) for v in st.values()):
        return None
    return {str(k): float(v) for k, v in st.items()}


def _summed_state(parts: list[_Part]) -> dict[str, float] | None:
    """The whole model's optimizer-state bytes by key: the ranks' shards added up, when
    every rank sent them for this step (they do at the same steps)."""
    if any(p.state is None for p in parts):
        return None
    out: dict[str, float] = {}
    for p in parts:
        for k, v in (p.state or {}).items():
            out[k] = out.get(k, 0.0) + v
    return out


def _delta_by_group(parts: list[_Part], order: list[str]) -> list[float | None] | None:
    """Per-group sums of the sampled update; None for a group some rank did not sample."""
    acc: dict[str, list[float]] = {g: [] for g in order}
    missing: set[str] = set()
    for p in parts:
        if p.dsq is None:
            return None
        for g, v in zip(p.groups, p.dsq):
            if _num(v):
                acc.setdefault(g, []).append(float(v))
            else:
                missing.add(g)
    return [None if g in missing or not acc[g] else math.fsum(acc[g]) for g in order]


class ShardAssembler:
    """Collects sharded step frames and writes the assembled global series.

    Args:
        store: where series go.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._runs: OrderedDict[tuple[str, str], OrderedDict[int, dict[int, _Part]]] = OrderedDict()
        self._labels: dict[tuple[Labels, str], Labels] = {}
        self._group_labels = GroupLabels()
        self._gvr = GvrTracker()
        self.assembled = 0
        """Steps assembled so far (all runs)."""
        self.incomplete = 0
        """Steps dropped before all ranks' frames came."""

    def route(self, f: dict[str, Any], add: Callable[..., None], base: Labels,
              ctx: Ingested) -> dict[str, Any]:
        """Handle a step frame's additive fields if it is sharded.

        Args:
            f: the decoded step frame.
            add: ``add(name, value, **extra)`` writes a gauge sample of the frame's rank.
            base: the frame's ``job``/``run``/``rank`` labels.
            ctx: the rules' context; non-finite groups of this rank are added to it.

        Returns:
            ``f`` itself when it is not sharded; else a copy without the additive fields,
            for the rest of the ingest, which must not take them for the model's. When this
            frame completes its step, ``ctx.assembled`` gets the step's whole-model sums:
            ``{"job", "run", "rank": 0, "world", "step", "t"`` (rank 0's), ``"groups",
            "grad_sumsq", "param_sumsq"?, "delta_sumsq"?}`` (None in ``delta_sumsq``: a
            group some rank did not sample).
        """
        if f.get("shard") != "sharded":
            return f
        rest = {k: v for k, v in f.items() if k not in _ADDITIVE}
        groups = f.get("groups") or []
        gsq = f.get("grad_sumsq")
        if gsq is None:
            return rest
        self._local(groups, gsq, f.get("param_sumsq"), add, base, ctx, f["step"], float(f["t"]))
        world, rank = f.get("world"), f["rank"]
        if not (isinstance(world, int) and 0 < world <= MAX_WORLD and 0 <= rank < world):
            return rest
        part = _Part(base, float(f["t"]), list(groups), list(gsq), f.get("param_sumsq"),
                     f.get("delta_sumsq"),
                     float(f["grad_l1"]) if _num(f.get("grad_l1")) else None,
                     float(f["grad_count"]) if _num(f.get("grad_count")) else None,
                     _state(f.get("state_bytes")))
        done = self._collect((f["job"], f["run"]), f["step"], rank, world, part)
        if done is not None:
            ctx.assembled.append(done)
        return rest

    # -- per rank, at once ------------------------------------------------------------

    def _local(self, groups: list[str], gsq: list[float], psq: Any, add: Callable[..., None],
               base: Labels, ctx: Ingested, step: int, t: float) -> None:
        add("sentinel_local_grad_norm", _sqrt(math.fsum(gsq)))
        self.store.add_row("sentinel_local_group_grad_norm", self._group_labels(base, groups),
                           _norms(np.asarray(gsq, dtype=np.float64)), step, t)
        for source, vals in (("grad", gsq), ("param", psq)):
            if vals is None:
                continue
            bad = [g for g, v in zip(groups, vals) if not math.isfinite(v)]
            add("sentinel_nonfinite_detected", 1.0 if bad else 0.0, source=source)
            self.store.inc("sentinel_nonfinite_total", self._label(base, "source", source), float(bool(bad)))
            if bad:
                ctx.nonfinite_groups[source] = bad

    # -- assembly ---------------------------------------------------------------------

    def _collect(self, run: tuple[str, str], step: int, rank: int, world: int,
                 part: _Part) -> dict[str, Any] | None:
        steps = self._runs.get(run)
        if steps is None:
            steps = self._runs[run] = OrderedDict()
            while len(self._runs) > MAX_RUNS:
                _, old = self._runs.popitem(last=False)
                for parts in old.values():
                    self._drop(parts)
        else:
            self._runs.move_to_end(run)
        parts = steps.setdefault(step, {})
        parts[rank] = part  # a repeated frame of a rank replaces its earlier one
        if len(parts) >= world:
            del steps[step]
            for old_step in [s for s in steps if s < step]:  # a later step is complete: those never will be
                self._drop(steps.pop(old_step))
            return self._assemble(run, step, [parts[r] for r in sorted(parts)])
        while len(steps) > MAX_STEPS:
            _, old_parts = steps.popitem(last=False)
            self._drop(old_parts)
        return None

    def _drop(self, parts: dict[int, _Part]) -> None:
        self.incomplete += 1
        for p in parts.values():
            self.store.inc("sentinel_shard_steps_incomplete_total", p.base)

    def _assemble(self, run: tuple[str, str], step: int, parts: list[_Part]) -> dict[str, Any]:
        self.assembled += 1
        store = self.store
        order = parts[0].groups
        if not all(p.groups == order for p in parts):
            order = list(dict.fromkeys(g for p in parts for g in p.groups))
        gsq = _by_group(parts, "gsq", order)
        assert gsq is not None  # every part has grad sums
        total = math.fsum(gsq.tolist())
        norm = _sqrt(total)
        gnorms = _norms(gsq)
        psq = _by_group(parts, "psq", order)
        pnorms = None if psq is None else _norms(psq)
        pnorm = None if psq is None else _sqrt(math.fsum(psq.tolist()))
        dsq = _delta_by_group(parts, order) if psq is not None else None
        scalars = [("sentinel_grad_norm", norm)]
        if all(p.l1 is not None and p.count for p in parts):
            n = math.fsum(p.count or 0.0 for p in parts)
            mean_abs, mean_sq = math.fsum(p.l1 or 0.0 for p in parts) / n, total / n
            std = _sqrt(mean_sq - mean_abs * mean_abs)
            scalars.append(("sentinel_gradient_snr", mean_abs / std if std > 0 else float("nan")))
        if pnorm is not None:
            scalars.append(("sentinel_param_norm", pnorm))
        gvr = self._gvr.push((parts[0].base, "assembled"), norm)  # the same on every rank: taken once
        if gvr is not None:
            scalars.append(("sentinel_gradient_variance_ratio", gvr))
        state = _summed_state(parts)
        for p in parts:  # every rank's series get the model's values, at that rank's time
            store.add_rows([(name, p.base, v) for name, v in scalars], step, p.t)
            if state:
                store.add_rows([("sentinel_model_optimizer_state_bytes", self._label(p.base, "state", k), v)
                                for k, v in state.items()], step, p.t)
            labels = self._group_labels(p.base, order)
            store.add_row("sentinel_group_grad_norm", labels, gnorms, step, p.t)
            if psq is not None and pnorms is not None:
                store.add_row("sentinel_group_param_norm", labels, pnorms, step, p.t)
                if dsq is not None:
                    ratio = write_update_ratios(store, p.base, labels, psq.tolist(), dsq, step, p.t)
                    if ratio is not None:
                        store.add("sentinel_update_ratio", p.base, step, p.t, ratio)
        out: dict[str, Any] = {"kind": "step", "job": run[0], "run": run[1], "rank": 0, "world": len(parts),
                               "step": step, "t": parts[0].t, "groups": list(order), "grad_sumsq": gsq.tolist()}
        if psq is not None:
            out["param_sumsq"] = psq.tolist()
            if dsq is not None:
                out["delta_sumsq"] = dsq
        return out

    def _label(self, base: Labels, key: str, value: str) -> Labels:
        ck = (base, key + "\0" + value)
        labels = self._labels.get(ck)
        if labels is None:
            if len(self._labels) > 100_000:
                self._labels.clear()
            labels = self._labels[ck] = tuple(sorted(base + ((key, value),)))
        return labels
