"""A small read-only status page for the embedded engine (``GET /``)."""

from __future__ import annotations

import html
from typing import Any

_ROWS = [("step", "sentinel_step", "{:.0f}"), ("loss", "sentinel_loss", "{:.4g}"),
         ("grad norm", "sentinel_grad_norm", "{:.4g}"), ("update ratio", "sentinel_update_ratio", "{:.2e}"),
         ("step time (s)", "sentinel_step_duration_seconds", "{:.3f}")]


def status_page(engine: Any) -> str:
    """HTML with the latest values per rank and the alerts; refreshes itself every 5 s."""
    store = engine.store
    ranks: dict[str, dict[str, str]] = {}
    for label, name, fmt in _ROWS:
        for labels in store.labelsets(name):
            last = store.last(name, labels)
            if last is not None:
                key = ", ".join(f"{k}={v}" for k, v in labels)
                ranks.setdefault(key, {})[label] = fmt.format(last[2])
    head = "".join(f"<th>{html.escape(label)}</th>" for label, _, _ in _ROWS)
    body = "".join(
        f"<tr><td>{html.escape(k)}</td>" + "".join(f"<td>{v.get(label, '—')}</td>" for label, _, _ in _ROWS)
        + "</tr>" for k, v in sorted(ranks.items()))
    alerts = "".join(
        f"<tr class='{html.escape(a['state'])}'><td>{html.escape(a['state'])}</td>"
        f"<td>{html.escape(a['severity'])}</td><td>{html.escape(a['alertname'])}</td>"
        f"<td>{html.escape(a['summary'])}</td></tr>" for a in engine.alerts_json())
    return f"""<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>sentinel</title><style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;
text-align:left}}tr.firing{{background:#fdd}}tr.pending{{background:#ffd}}</style></head><body>
<h1>sentinel</h1><h2>runs</h2><table><tr><th>series</th>{head}</tr>{body}</table>
<h2>alerts</h2><table><tr><th>state</th><th>severity</th><th>alert</th><th>summary</th></tr>
{alerts or "<tr><td colspan=4>no alerts</td></tr>"}</table>
<p><a href="/metrics">/metrics</a> · <a href="/api/v1/alerts">/api/v1/alerts</a></p></body></html>"""
