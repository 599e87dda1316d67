"""``sentinel report RUN``: one self-contained HTML page (inline SVG, no script, no network),
a terminal summary, or the plots as PNG files (matplotlib, the optional ``report`` extra)."""

from __future__ import annotations

import json
import math
import sqlite3
import time
from html import escape
from pathlib import Path
from typing import Any

from sentinel.files import safe_name
from sentinel.history import query
from sentinel.history.query import RunInfo, Series
from sentinel.history.svg import heatmap, line_chart

SEVERITY_COLOUR = {"critical": "#d62728", "warning": "#ff7f0e", "info": "#1f77b4"}

PLOTS: list[tuple[str, list[tuple[str, str]], bool]] = [
    ("Loss", [("loss", "loss")], False),
    ("Gradient norm", [("post-clip (stepped)", "grad_norm"), ("pre-clip", "clip_norm")], True),
    ("Update ratio ‖Δw‖/‖w‖", [("", "update_ratio")], True),
    ("‖Δw‖", [("", "delta_norm")], True),
    ("Learning rate", [("param group 0", "lr")], False),
    ("Memory (bytes)", [("used", "mem_used"), ("peak", "mem_peak")], False),
    ("AMP loss scale", [("", "loss_scale")], True),
]
"""``(title, [(legend, column)], log scale)`` for each plot over steps."""


def fmt(v: float | None, spec: str = ".4g") -> str:
    """A number for a table; ``—`` for none."""
    if v is None:
        return "—"
    return format(v, spec) if math.isfinite(v) else str(v)


def fmt_bytes(v: float | None) -> str:
    if v is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.1f} {unit}" if unit != "B" else f"{v:.0f} B"
        v /= 1024
    return "—"


def fmt_time(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "—"


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "—"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _markers(alerts: list[dict[str, Any]]) -> list[tuple[float, str, str]]:
    return [(float(a["step"]), SEVERITY_COLOUR.get(a["severity"], "#555"), f"{a['alertname']} at step {a['step']}")
            for a in alerts if a["state_to"] == "firing" and a["step"] is not None]


def plots(run: RunInfo, s: Series, alerts: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(title, svg)`` for every plot of the report (those with no data say so)."""
    marks = _markers(alerts)
    out = []
    for title, cols, log in PLOTS:
        lines = [(legend, s.steps, s.columns[c]) for legend, c in cols if any(v is not None for v in s.columns[c])]
        out.append((title, line_chart(title, lines, log=log, markers=marks)))
    steps = s.group_steps
    out.append(("Per-group gradient norm", heatmap("Per-group gradient norm", steps, run.groups, s.group_grad)))
    ratio_rows = [r for r in s.group_ratio if any(math.isfinite(x) for x in r)]
    ratio_steps = [st for st, r in zip(steps, s.group_ratio) if any(math.isfinite(x) for x in r)]
    out.append(("Per-group update ratio", heatmap("Per-group update ratio", ratio_steps, run.groups, ratio_rows)))
    return out


def summary_rows(run: RunInfo) -> list[tuple[str, str]]:
    """The facts of a run, for the page and the terminal."""
    opt = run.optimizer_name or "—"
    hyper = ", ".join(f"{k}={v}" for o in (run.optimizer or []) for k, v in o.items() if k != "class")
    return [
        ("run", f"{run.job}/{run.label}"), ("state", run.state + (f" (exit {run.exit_status})"
                                                                if run.exit_status else "")),
        ("optimizer", opt + (f" ({hyper})" if hyper else "")),
        ("tags", ", ".join(f"{k}={v}" for k, v in run.tags.items()) or "—"),
        ("command", run.command or "—"), ("host", run.host or "—"), ("ranks", str(run.ranks)),
        ("started", fmt_time(run.started)), ("duration", fmt_duration(run.duration)), ("steps", str(run.steps)),
        ("first loss", fmt(run.first_loss)), ("final loss", fmt(run.final_loss)), ("min loss", fmt(run.min_loss)),
        ("mean grad norm", fmt(run.mean_grad_norm)), ("mean ‖Δw‖", fmt(run.mean_delta_norm)),
        ("peak memory", fmt_bytes(run.peak_memory)), ("non-finite seen", "yes" if run.nonfinite else "no"),
        ("alerts fired", ", ".join(f"{n} {sev}" for sev, n in sorted(run.alerts.items())) or "none"),
        ("series stride", f"every {run.stride} step(s) kept" if run.stride > 1 else "every step kept"),
    ]


_CSS = ("body{font-family:system-ui,sans-serif;margin:24px;max-width:1340px;color:#222}"
        "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;"
        "text-align:left;font-size:13px;vertical-align:top}.plots{display:flex;flex-wrap:wrap;gap:12px}"
        ".critical{color:#d62728}.warning{color:#ff7f0e}.empty{color:#888;font-size:13px}"
        "pre{background:#f6f6f6;padding:8px;font-size:12px;overflow:auto}")


def html_report(db: sqlite3.Connection, run: RunInfo) -> str:
    """The whole report page as one string."""
    s = query.series(db, run)
    alerts = query.alerts(db, run)
    facts = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary_rows(run))
    figs = "".join(f'<figure data-plot="{escape(t)}">{svg}</figure>' for t, svg in plots(run, s, alerts))
    rows = []
    for a in alerts:
        rows.append(f'<tr class="{escape(a["severity"])}"><td>{a["step"]}</td><td>{escape(a["alertname"])}</td>'
                    f'<td>{escape(a["severity"])}</td><td>{escape(str(a["state_to"]))}</td>'
                    f'<td>{escape(a["summary"] or "")}</td><td>{escape("; ".join(a["causes"]))}</td>'
                    f'<td>{escape("; ".join(a["checks"]))}</td></tr>')
    alert_table = ("<table><tr><th>step</th><th>alert</th><th>severity</th><th>state</th><th>summary</th>"
                   "<th>likely causes</th><th>first checks</th></tr>" + "".join(rows) + "</table>") if rows \
        else "<p>No alert fired.</p>"
    env = (f"<pre>{escape(json.dumps(run.env, indent=2, sort_keys=True))}</pre>" if run.env
           else "<p class=\"empty\">No environment record in this run's frames.</p>")
    title = f"sentinel report: {run.job}/{run.label}"
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{escape(title)}</h1><table>{facts}</table>"
            f"<h2>Over steps</h2><div class=\"plots\">{figs}</div><h2>Alerts</h2>{alert_table}"
            f"<h2>Environment</h2>{env}<p class=\"empty\">Written by sentinel at {fmt_time(time.time())}.</p>"
            "</body></html>")


def text_summary(db: sqlite3.Connection, run: RunInfo) -> str:
    """The terminal summary: the facts and the alerts that fired."""
    width = max(len(k) for k, _ in summary_rows(run))
    lines = [f"{k:<{width}}  {v}" for k, v in summary_rows(run)]
    for a in query.alerts(db, run):
        if a["state_to"] == "firing":
            lines.append(f"step {a['step']}: {a['alertname']} ({a['severity']}): {a['summary']}")
            if a["checks"]:
                lines.append("    first checks: " + "; ".join(a["checks"][:3]))
    return "\n".join(lines)


def png_report(db: sqlite3.Connection, run: RunInfo, folder: Path) -> list[Path]:
    """Each over-steps plot as a PNG in ``folder``.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'sentinel-monitor[report]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = query.series(db, run)
    marks = _markers(query.alerts(db, run))
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for title, cols, log in PLOTS:
        curves = [(legend, c) for legend, c in cols if any(v is not None for v in s.columns[c])]
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(7, 3))
        for legend, c in curves:
            pts = [(x, y) for x, y in zip(s.steps, s.columns[c]) if y is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=legend or None, linewidth=1.2)
        for x, colour, _ in marks:
            ax.axvline(x, color=colour, linestyle="--", linewidth=0.8)
        if log:
            ax.set_yscale("log")
        ax.set_title(f"{run.label}: {title}")
        ax.set_xlabel("step")
        if any(legend for legend, _ in curves):
            ax.legend(fontsize=8)
        fig.tight_layout()
        name = "".join(ch if ch.isascii() and ch.isalnum() else "_" for ch in title.lower()).strip("_")
        path = folder / f"{safe_name(run.label, 100, keep='@')}-{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
