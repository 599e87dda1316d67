"""Export profiles: how many series a node's daemon exports.

``full`` (the default) exports every series of every rank. ``fleet`` (``profile: fleet`` in
the config, ``SENTINEL_PROFILE=fleet``) keeps a node within a series budget for clusters of
many nodes: the job-wide and per-rank series stay, and the per-group series (those with a
``group`` label) are exported only

- from the lowest rank of each run on the node: in a DDP job the gradients are all-reduced,
  so every rank's per-group norms equal rank 0's; in an FSDP job the daemon writes the
  assembled per-group norms under every rank's labels, equal too;
- and for any group named by an active (pending or firing) alert of the run, from the
  ranks the alert names, while it lasts: the group a rule points at can be compared
  across ranks. (A node whose 8 ranks all alert on k groups exports 7 x 5 x k more.)

``sentinel_local_group_grad_norm`` (a rank's own shard of a group, for assembling a
multi-node FSDP job's per-group norm in PromQL) is not exported in ``fleet``: one rank's
shard is not the group's norm, and a partial sum would be a wrong number, so
``job_run_group:sentinel_grad_norm:l2`` is absent there for FSDP jobs that span nodes (the
job-wide ``job_run:sentinel_grad_norm:l2`` stays exact).

The rule engine reads the store, never the export: rules judge every rank and group in
both profiles. docs/deployment.md gives the measured budget (benchmarks/series_budget.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sentinel.store import Row

PROFILES = ("full", "fleet")
_SHARD_ONLY = frozenset({"sentinel_local_group_grad_norm"})


def fleet_rows(rows: Iterable[Row], active: Iterable[dict[str, Any]]) -> Iterator[Row]:
    """The rows the ``fleet`` profile exports (see the module's docstring).

    Args:
        rows: ``(name, kind, labels, value)``, as the store's snapshot gives them.
        active: the engine's active alerts (``job``, ``run`` and ``groups`` read).
    """
    rows = list(rows)
    lowest: dict[tuple[str, str], int] = {}
    for _, _, labels, _ in rows:
        d = dict(labels)
        if "group" in d and d.get("rank", "").isdigit():
            key = (d.get("job", ""), d.get("run", ""))
            r = int(d["rank"])
            if r < lowest.get(key, r + 1):
                lowest[key] = r
    pointed = {(str(a.get("job")), str(a.get("run")), str(g), str(r))
               for a in active for g in a.get("groups") or () for r in a.get("ranks") or ()}
    for row in rows:
        name, _, labels, _ = row
        d = dict(labels)
        group = d.get("group")
        if group is None:
            yield row
            continue
        if name in _SHARD_ONLY:
            continue
        job, run = d.get("job", ""), d.get("run", "")
        rank = d.get("rank", "")
        if (rank.isdigit() and int(rank) == lowest.get((job, run))) or (job, run, group, rank) in pointed:
            yield row


def profile_filter(profile: str, active: Callable[[], Iterable[dict[str, Any]]]
                   ) -> Callable[[Iterable[Row]], Iterable[Row]] | None:
    """The store-rows filter of ``profile``; None for ``full`` (everything).

    Raises:
        ValueError: an unknown profile.
    """
    if profile == "full":
        return None
    if profile == "fleet":
        return lambda rows: fleet_rows(rows, active())
    raise ValueError(f"profile: must be one of {', '.join(PROFILES)}, got {profile!r}")
