"""``GET /api/v1/status``: the small JSON document the status page polls.

Bounded whatever the job's size, so polling stays light for the engine at 64 ranks × 64
groups:

- at most :data:`MAX_RUNS` runs (the most recently active first), every rank of each
  with its state and latest key values (a few numbers per rank), and for a stalled one
  the call its training thread waits in, where it said (``where``);
- chart series for the selected run only (``?run=JOB/RUN``, else the most recent), for at
  most :data:`MAX_CHART_RANKS` ranks, each thinned to at most ``points`` samples (default
  :data:`POINTS`, capped at :data:`MAX_POINTS`) of the store's last 512;
- the per-group view of the selected run: the :data:`TOP_GROUPS` largest and smallest
  gradient norms and every non-finite group, each the maximum over ranks;
- at most :data:`MAX_ALERTS` alerts, active ones first.

Values that are not finite are sent as ``null`` (JSON has no NaN) and, for groups, flagged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from sentinel.rules.stall import siblings_stepped
from sentinel.store import Labels, Store

MAX_RUNS = 8
MAX_CHART_RANKS = 4
POINTS = 150
MAX_POINTS = 512
TOP_GROUPS = 8
MAX_ALERTS = 50
STALL_SECONDS = 30.0
"""A rank with no step for max(this, 10 × its median step time) shows as stalled, or as
evaluating while the run's heartbeats (any rank's evaluation between steps: the others
wait for it) are that recent (waiting where the latest said it had no work: a notebook's
kernel between cells), or as idle while another optimizer's stream of its process
steps (a layer trained after this one's)."""

CHARTS: dict[str, str] = {
    "loss": "sentinel_loss",
    "grad_norm": "sentinel_grad_norm",
    "update_ratio": "sentinel_update_ratio",
    "learning_rate": "sentinel_learning_rate",
    "memory_used": "sentinel_memory_used_bytes",
}
"""Chart name → the series drawn (the learning rate of param group 0)."""
VALUES: dict[str, str] = {
    **CHARTS,
    "step": "sentinel_step",
    "step_time": "sentinel_step_duration_seconds",
    "memory_capacity": "sentinel_memory_capacity_bytes",
    "last_step_time": "sentinel_last_step_timestamp_seconds",
    "last_heartbeat": "sentinel_last_heartbeat_timestamp_seconds",
    "last_wait": "sentinel_last_wait_timestamp_seconds",
}


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _value(x: float) -> float | str:
    """A current value: a number, or ``"NaN"``/``"Inf"``/``"-Inf"`` (JSON has no such numbers,
    and a NaN loss is exactly what the page must show, not a blank)."""
    if math.isfinite(x):
        return float(x)
    return "NaN" if math.isnan(x) else ("Inf" if x > 0 else "-Inf")


Key = tuple[str, str, int, str]
"""``(job, run, rank, optimizer stream)``: a row of the page (stream ``""``: the rank's only one)."""


def _base(labels: Labels) -> Key | None:
    d = dict(labels)
    try:
        return d["job"], d["run"], int(d["rank"]), d.get("optimizer", "")
    except (KeyError, ValueError):
        return None


def _is_rank_series(name: str, labels: Labels) -> bool:
    """The plain per-rank (per-stream) series (learning rate: param group 0 only)."""
    keys = {k for k, _ in labels} - {"optimizer"}
    if name == "sentinel_learning_rate":
        return ("param_group", "0") in labels
    return keys == {"job", "run", "rank"}


def _thin(steps: np.ndarray, values: np.ndarray, points: int) -> list[list[float | None]]:
    n = len(values)
    if n > points:  # keep the newest sample: a chart's right edge is now
        idx = np.unique(np.linspace(0, n - 1, points).round().astype(int))
        steps, values = steps[idx], values[idx]
    return [[int(s), _num(float(v))] for s, v in zip(steps, values)]


def _state(engine: Any, key: Key, last_time: float | None, step_times: list[float],
           now: float, heartbeat: float | None, sibling: float | None = None, wait: float | None = None) -> str:
    if key[:3] in getattr(engine, "exited_ranks", {}):
        return "crashed"
    if key[:3] in getattr(engine, "finished", set()):
        return "ended"
    if last_time is not None and step_times:
        limit = max(STALL_SECONDS, 10.0 * float(np.median(step_times)))
        if now - last_time > limit:
            if heartbeat is not None and heartbeat > last_time and now - heartbeat <= limit:
                # the latest beat said it had no work: a notebook's kernel between cells
                return "waiting" if wait is not None and wait >= heartbeat else "evaluating"
            # its process steps another optimizer (a layer trained after this one's)
            return "idle" if sibling is not None and now - sibling <= limit else "stalled"
    return "training"


def status_json(engine: Any, query: Mapping[str, str] | None = None, now: float | None = None) -> dict[str, Any]:
    """The status document (see the module docstring).

    Args:
        engine: the engine (its ``store``, ``alerts_json()``, and the ``finished`` and
            ``exited_ranks`` it keeps).
        query: ``run`` (``JOB/RUN``) selects the charted run; ``points`` thins the charts.
        now: the wall clock, for tests.
    """
    query = query or {}
    now = time.time() if now is None else now
    store: Store = engine.store
    try:
        points = max(2, min(MAX_POINTS, int(query.get("points", POINTS))))
    except ValueError:
        points = POINTS
    ranks: dict[Key, dict[str, Any]] = {}
    series: dict[Key, dict[str, Labels]] = {}
    for key_name, name in VALUES.items():
        for labels in store.labelsets(name):
            base = _base(labels)
            if base is None or not _is_rank_series(name, labels):
                continue
            last = store.last(name, labels)
            if last is None:
                continue
            ranks.setdefault(base, {})[key_name] = _value(last[2])
            series.setdefault(base, {})[key_name] = labels
    for alert in engine.alerts_json():  # a rank that crashed before its first step is still a rank
        for r in alert.get("ranks", []) if alert.get("job") != "node" else []:
            if not any(k[:3] == (alert["job"], alert["run"], int(r)) for k in ranks):
                ranks.setdefault((alert["job"], alert["run"], int(r), ""), {})
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    recency: dict[tuple[str, str], float] = {}
    beats: dict[tuple[str, str], float] = {}  # each run's latest heartbeat, any rank's
    waits: dict[tuple[str, str], float] = {}  # ... and its latest sent while waiting for work
    for key, values in ranks.items():
        beat = values.pop("last_heartbeat", None)
        if isinstance(beat, float):
            beats[key[:2]] = max(beat, beats.get(key[:2], beat))
        wait = values.pop("last_wait", None)
        if isinstance(wait, float):
            waits[key[:2]] = max(wait, waits.get(key[:2], wait))
    last_times = {key: t for key, values in ranks.items()
                  for t in (values.pop("last_step_time", None),) if isinstance(t, float)}
    # a stream silent while another of its rank and process steps (the engine's pids where known)
    siblings = (siblings_stepped(last_times, getattr(engine, "pids", {}).get)
                if len({k[:3] for k in last_times}) < len(last_times) else {})
    wheres: dict[Key, str] = getattr(engine, "wheres", {})
    for key in sorted(ranks):
        values = ranks[key]
        last_time = last_times.get(key)
        window = store.window("sentinel_step_duration_seconds", series.get(key, {}).get("step_time", ()), 50)
        step_times = [] if window is None else [float(v) for v in window.values if math.isfinite(v)]
        state = _state(engine, key, last_time, step_times, now, beats.get(key[:2]), siblings.get(key),
                       waits.get(key[:2]))
        where = wheres.get(key) if state == "stalled" else None  # the call its training thread waits in
        runs.setdefault(key[:2], []).append({
            "rank": key[2], "state": state, "values": values,
            "seconds_since_step": None if last_time is None else max(0.0, now - last_time),
            **({"optimizer": key[3]} if key[3] else {}), **({"where": where} if where else {})})
        recency[key[:2]] = max(recency.get(key[:2], 0.0), last_time or 0.0)
    order = sorted(runs, key=lambda k: -recency[k])[:MAX_RUNS]
    wanted = query.get("run")
    selected = next((k for k in order if f"{k[0]}/{k[1]}" == wanted), order[0] if order else None)
    doc: dict[str, Any] = {
        "time": now,
        "runs": [{"job": j, "run": r, "id": f"{j}/{r}", "state": _run_state(runs[(j, r)]),
                  "ranks": runs[(j, r)]} for j, r in order],
        "selected": None if selected is None else f"{selected[0]}/{selected[1]}",
        "charts": {}, "groups": {}, "alerts": engine.alerts_json()[:MAX_ALERTS],
    }
    if selected is not None:
        doc["charts"] = _charts(store, selected, series, points)
        doc["groups"] = _groups(store, selected)
    return doc


def _run_state(ranks: list[dict[str, Any]]) -> str:
    states = {r["state"] for r in ranks}
    for s in ("crashed", "stalled", "training", "evaluating", "waiting", "idle"):
        if s in states:
            return s
    return "ended"


def _charts(store: Store, run: tuple[str, str], series: dict[Key, dict[str, Labels]],
            points: int) -> dict[str, dict[str, Any]]:
    keys = sorted(k for k in series if k[:2] == run)[:MAX_CHART_RANKS]
    out: dict[str, dict[str, Any]] = {}
    for chart in CHARTS:
        lines = {}
        for key in keys:
            labels = series[key].get(chart)
            window = None if labels is None else store.window(CHARTS[chart], labels)
            if window is not None and len(window):
                line = _thin(window.steps, window.values, points)
                step = store.last("sentinel_step", series[key].get("step", ()))
                if chart == "learning_rate" and step is not None and step[2] > (line[-1][0] or 0):
                    line.append([int(step[2]), line[-1][1]])  # reported when it changes: it holds until now
                lines[f"{key[2]} (optimizer {key[3]})" if key[3] else str(key[2])] = line
        out[chart] = {"ranks": lines}
    return out


def _groups(store: Store, run: tuple[str, str]) -> dict[str, Any]:
    """Per group, the maximum over ranks of the latest gradient norm, parameter norm and
    update ratio; the largest and smallest by gradient norm, and the non-finite ones."""
    job, name = run
    table: dict[str, dict[str, float]] = {}
    for metric, key in (("sentinel_group_grad_norm", "grad_norm"), ("sentinel_group_param_norm", "param_norm"),
                        ("sentinel_group_update_ratio", "update_ratio")):
        for labels in store.labelsets(metric):
            d = dict(labels)
            if d.get("job") != job or d.get("run") != name or "group" not in d:
                continue
            last = store.last(metric, labels)
            if last is None:
                continue
            row = table.setdefault(d["group"], {})
            v = last[2]
            if not math.isfinite(v):
                row[key] = math.nan
            elif not math.isnan(row.get(key, 0.0)):
                row[key] = max(row.get(key, -math.inf), v)
    rows: list[dict[str, Any]] = [{"group": g, **{k: _num(v) for k, v in r.items()},
                                   "nonfinite": any(not math.isfinite(v) for v in r.values())}
                                  for g, r in table.items()]
    finite = sorted((r for r in rows if not r["nonfinite"] and r.get("grad_norm") is not None),
                    key=lambda r: -float(r["grad_norm"]))
    return {"count": len(rows), "largest": finite[:TOP_GROUPS],
            "smallest": finite[::-1][:TOP_GROUPS] if len(finite) > TOP_GROUPS else [],
            "nonfinite": sorted((r for r in rows if r["nonfinite"]), key=lambda r: r["group"])[:64]}
