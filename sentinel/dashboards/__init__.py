"""Grafana dashboards as code (grafana-foundation-sdk, the Grafana 11.6 flavour).

``sentinel dashboards generate`` writes :func:`render`'s JSON under ``dashboards/``; a test
regenerates it and compares byte for byte. Imports only the ground floor and the rule pack
(thresholds are read from it), so the SDK is loaded only by the functions that build.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sentinel.rules.config import RulePack, load_pack

__all__ = ["GRAFANA_FLAVOUR", "build", "render", "write", "panel_queries"]

GRAFANA_FLAVOUR = "11.6"
"""The Grafana version the SDK's builders and the generated JSON target."""


def build(pack: RulePack | None = None) -> dict[str, dict[str, Any]]:
    """Every dashboard as a JSON-ready dict, by file stem (``overview``, ``layers``, ...).

    Args:
        pack: the rule pack whose thresholds the panels draw (the built-in one by default).

    Raises:
        ImportError: grafana-foundation-sdk is not installed (``pip install 'sentinel-monitor[dashboards]'``).
    """
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    from sentinel.dashboards.boards import BOARDS
    from sentinel.dashboards.panels import ANNOTATION_EXTRA

    pack = pack if pack is not None else load_pack()
    out: dict[str, dict[str, Any]] = {}
    for stem, make in BOARDS.items():
        doc: dict[str, Any] = json.loads(json.dumps(make(pack).build(), cls=JSONEncoder))
        for ann in doc.get("annotations", {}).get("list", []):
            if ann.get("name") == "Sentinel alerts":
                ann.update(ANNOTATION_EXTRA)
        _number_panels(doc)
        out[stem] = doc
    return out


def _number_panels(doc: dict[str, Any]) -> None:
    """Stable panel ids (Grafana needs them unique; links use ``viewPanel=<id>``)."""
    for i, p in enumerate(doc.get("panels", []), start=1):
        p["id"] = i


def render(pack: RulePack | None = None) -> dict[str, str]:
    """File name → the exact text committed under ``dashboards/`` (sorted keys, 2-space indent)."""
    return {f"{stem}.json": json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            for stem, doc in build(pack).items()}


def write(folder: str | Path, pack: RulePack | None = None) -> list[Path]:
    """Write every dashboard into ``folder``; returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in render(pack).items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def panel_queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every query of a dashboard JSON, annotations included."""
    out = []
    for p in doc.get("panels", []):
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append((str(p.get("title", "")), str(t["expr"])))
    for ann in doc.get("annotations", {}).get("list", []):
        if ann.get("expr"):
            out.append((f"annotation {ann.get('name')}", str(ann["expr"])))
    return out
