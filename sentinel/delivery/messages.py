"""The text of a notification: title and body for one alert transition.

A *notice* is the transition's JSON (:meth:`Transition.to_json`) plus what the service
knows at that moment: ``host``, ``pid``, ``recent`` (the metric's last values, for the
sparkline), ``metric``, ``tags``, ``grafana`` (a dashboard link or ""), ``key`` (the
idempotency key), and with ``actions.capture_on`` ``evidence`` (the evidence file's path)
and ``inputs`` (the batch files the ranks write). Pure functions: rendering never fails
on a missing field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sentinel.rules.alert import compact_groups, compact_optimizers, compact_ranks

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 24) -> str:
    """``▁▂▅█`` of the last ``width`` values; non-finite ones are ``✗``; "" for none."""
    vals = list(values)[-width:]
    finite = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
    if not finite:
        return "✗" * len(vals)
    lo, hi = min(finite), max(finite)
    out = []
    for v in vals:
        if not (isinstance(v, (int, float)) and math.isfinite(v)):
            out.append("✗")
        elif hi == lo:
            out.append(_BARS[0])
        else:
            out.append(_BARS[min(len(_BARS) - 1, int((v - lo) / (hi - lo) * len(_BARS)))])
    return "".join(out)


def duration(seconds: float) -> str:
    """``45 s``, ``12 min 5 s``, ``3 h 20 min``."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _num(x: Any) -> str:
    return "n/a" if not isinstance(x, (int, float)) else f"{x:.4g}"


def title(n: Mapping[str, Any]) -> str:
    """``[FIRING] critical TrainingNonFinite — run r1, since step 200``."""
    state = "FIRING" if n.get("state_to") == "firing" else "ENDED" if n.get("ended") else "RESOLVED"
    return (f"[{state}] {n.get('severity', '?')} {n.get('alertname', '?')} — run {n.get('run', '?')}, "
            f"since step {n.get('started_step', n.get('step', '?'))}")


def console_line(n: Mapping[str, Any]) -> str:
    """The title and the summary on one line, for stderr and the log:
    ``[FIRING] critical TrainingNonFinite — run r1, since step 200: loss is NaN …``."""
    return f"{title(n)}: {' '.join(str(n.get('summary', '')).split())}"


def body(n: Mapping[str, Any], markdown: bool = False) -> str:
    """The message body, markdown or plain text.

    Firing: summary; value against threshold; ranks and groups; a sparkline of recent
    values; likely causes; numbered first checks; runbook; the captured evidence and batch
    files; host and pid; Grafana link.
    Resolved: how long it fired, and where.
    """
    b = (lambda s: f"**{s}**") if markdown else (lambda s: s)
    bullet = "- "
    where = compact_ranks(list(n.get("ranks") or [])) + compact_optimizers([str(o) for o in n.get("optimizers") or []])
    groups = list(n.get("groups") or [])
    lines = [str(n.get("summary", "")), ""]
    if n.get("state_to") == "resolved":
        fired = max(0.0, float(n.get("time", 0.0)) - float(n.get("started_at", n.get("time", 0.0))))
        span = f"for {duration(fired)} (from step {n.get('started_step', '?')} to step {n.get('step', '?')})"
        lines += [f"{b('ended')} with its ranks while it fired {span}: the run finished or its processes "
                  "exited; nothing recovered" if n.get("ended") else f"{b('resolved')} after firing {span}"]
    lines += [f"{b('run')}: {n.get('run', '?')} (job {n.get('job', '?')})",
              f"{b('where')}: {where}" + (f", groups {compact_groups(groups, limit=5)}" if groups else ""),
              f"{b('started at step')}: {n.get('started_step', '?')}, latest step {n.get('step', '?')}",
              f"{b('value')}: {_num(n.get('value'))} against threshold {_num(n.get('threshold'))}"]
    recent = n.get("recent") or []
    if recent:
        spark = sparkline(recent)
        lines.append(f"{b('recent ' + str(n.get('metric', 'values')))}: "
                     + (f"`{spark}`" if markdown else spark) + f" (last {len(recent[-24:])})")
    if n.get("state_to") == "firing":
        causes, checks = list(n.get("causes") or []), list(n.get("checks") or [])
        if causes:
            lines += ["", b("likely causes") + ":"] + [bullet + str(c) for c in causes]
        if checks:
            lines += ["", b("first checks") + ":"] + [f"{i}. {c}" for i, c in enumerate(checks, 1)]
        if n.get("runbook"):
            lines += ["", f"{b('runbook')}: {str(n['runbook']).strip()}"]
        if n.get("evidence"):  # paths as code in markdown: an underscore is no emphasis
            def path(s: object) -> str:
                return f"`{s}`" if markdown else str(s)

            lines += ["", f"{b('evidence')}: {path(n['evidence'])}"]
            lines += [f"{b('batch')}: {path(p)}" for p in list(n.get("inputs") or [])[:8]]
    lines += ["", f"host {n.get('host', '?')}, pid {n.get('pid', '?')}"]
    if n.get("labels"):  # where the run runs: slurm_job=12 slurm_step=0 slurm_node=gpu7
        lines.append(" ".join(f"{k}={v}" for k, v in sorted(dict(n["labels"]).items())))
    if n.get("grafana"):
        lines.append(f"[Grafana dashboard]({n['grafana']})" if markdown else f"grafana: {n['grafana']}")
    if n.get("key"):
        lines.append(f"id: {n['key']}")
    return "\n".join(lines)
