"""Plots as inline SVG text: line charts and heatmaps, no library, no network."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
W, H, L, R, T, B = 640, 240, 64, 12, 28, 30

Line = tuple[str, Sequence[int | float], Sequence[float | None]]
"""``(label, xs, ys)``; a None or non-finite y is a gap."""


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _ok(y: float | None, log: bool) -> bool:
    return y is not None and math.isfinite(y) and (not log or y > 0)


def line_chart(title: str, lines: Sequence[Line], *, log: bool = False,
               markers: Sequence[tuple[float, str, str]] = (), cls: str = "plot") -> str:
    """An SVG line chart.

    Args:
        lines: the curves; each gets a colour and a legend entry.
        log: a log-scale y axis (non-positive values are gaps).
        markers: ``(x, colour, tooltip)`` vertical lines, e.g. alerts.

    Returns:
        The ``<svg>`` element, or a ``<p>`` saying there is nothing to plot.
    """
    pts = [(x, y) for _, xs, ys in lines for x, y in zip(xs, ys) if _ok(y, log)]
    if not pts:
        return f'<p class="empty">{escape(title)}: not recorded</p>'
    f = math.log10 if log else (lambda v: v)
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(f(p[1]) for p in pts), max(f(p[1]) for p in pts)  # type: ignore[arg-type]
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        pad = abs(y0) * 0.1 or 0.5
        y0, y1 = y0 - pad, y1 + pad

    def sx(x: float) -> float:
        return L + (x - x0) / (x1 - x0) * (W - L - R)

    def sy(y: float) -> float:
        return H - B - (f(y) - y0) / (y1 - y0) * (H - T - B)  # type: ignore[operator]

    out = [f'<svg class="{cls}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" '
           f'height="{H}" role="img"><title>{escape(title)}</title>',
           f'<text x="{L}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
           f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#ccc"/>']
    for i in range(5):  # y ticks
        yv = y0 + (y1 - y0) * i / 4
        yy = H - B - (H - T - B) * i / 4
        label = _fmt(10 ** yv if log else yv)
        out.append(f'<text x="{L - 4}" y="{yy + 4:.1f}" font-size="10" text-anchor="end">{label}</text>')
    for i in range(5):
        xv = x0 + (x1 - x0) * i / 4
        out.append(f'<text x="{sx(xv):.1f}" y="{H - 12}" font-size="10" text-anchor="middle">{_fmt(xv)}</text>')
    for x, colour, tip in markers:
        if x0 <= x <= x1:
            out.append(f'<line class="marker" x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{T}" y2="{H - B}" '
                       f'stroke="{colour}" stroke-dasharray="3,3"><title>{escape(tip)}</title></line>')
    for k, (label, xs, ys) in enumerate(lines):
        colour = PALETTE[k % len(PALETTE)]
        segs: list[list[str]] = [[]]
        for x, y in zip(xs, ys):
            if _ok(y, log):
                segs[-1].append(f"{sx(x):.1f},{sy(y):.1f}")  # type: ignore[arg-type]
            elif y is not None and segs[-1]:  # a non-finite value breaks the line; a step not sampled does not
                segs.append([])
        for seg in segs:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{colour}"/>')
            elif seg:
                out.append(f'<polyline class="series" fill="none" stroke="{colour}" stroke-width="1.4" '
                           f'points="{" ".join(seg)}"/>')
        if len(lines) > 1 or label:
            out.append(f'<text x="{W - R - 4}" y="{T + 12 + 12 * k}" font-size="10" text-anchor="end" '
                       f'fill="{colour}">{escape(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def heatmap(title: str, steps: Sequence[int], groups: Sequence[str], rows: Sequence[Sequence[float]],
            *, log: bool = True) -> str:
    """An SVG heatmap: one column per kept step (at most 200, evenly picked), one row per group."""
    if not rows or not groups:
        return f'<p class="empty">{escape(title)}: not recorded</p>'
    pick = list(range(len(rows))) if len(rows) <= 200 else [round(i * (len(rows) - 1) / 199) for i in range(200)]

    def v(x: float) -> float | None:
        if not math.isfinite(x) or (log and x <= 0):
            return None
        return math.log10(x) if log else x

    vals = [v(rows[i][g]) for i in pick for g in range(len(groups)) if g < len(rows[i])]
    finite = [x for x in vals if x is not None]
    if not finite:
        return f'<p class="empty">{escape(title)}: not recorded</p>'
    lo, hi = min(finite), max(finite)
    span = (hi - lo) or 1.0
    ng = len(groups)
    ch = max(4.0, min(14.0, 360.0 / ng))
    left, cw = 130, (W - 130 - R) / len(pick)
    height = T + ch * ng + B
    out = [f'<svg class="heatmap" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height:.0f}" '
           f'width="{W}" height="{height:.0f}" role="img"><title>{escape(title)}</title>',
           f'<text x="4" y="16" font-size="13" font-weight="bold">{escape(title)} '
           f'({"log10 " if log else ""}{_fmt(lo)} … {_fmt(hi)})</text>']
    for g, name in enumerate(groups):
        y = T + g * ch
        if ng <= 40 or g % max(1, ng // 40) == 0:
            out.append(f'<text x="{left - 4}" y="{y + ch * 0.8:.1f}" font-size="{min(10.0, ch):.0f}" '
                       f'text-anchor="end">{escape(name[:24])}</text>')
        for j, i in enumerate(pick):
            x = v(rows[i][g]) if g < len(rows[i]) else None
            if x is None:
                continue
            a = (x - lo) / span
            colour = f"rgb({int(255 * a)},{int(80 + 100 * (1 - abs(a - 0.5) * 2))},{int(255 * (1 - a))})"
            out.append(f'<rect x="{left + j * cw:.1f}" y="{y:.1f}" width="{cw + 0.5:.1f}" height="{ch:.1f}" '
                       f'fill="{colour}"/>')
    out.append(f'<text x="{left}" y="{height - 10:.0f}" font-size="10">step {steps[pick[0]]}</text>'
               f'<text x="{W - R}" y="{height - 10:.0f}" font-size="10" text-anchor="end">'
               f'step {steps[pick[-1]]}</text></svg>')
    return "".join(out)
