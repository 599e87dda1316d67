"""The dashboards as code: the committed JSON is what the generator writes, byte for byte;
stable uids, the variables, the alert annotation, and thresholds read from the rule pack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("grafana_foundation_sdk")

from typer.testing import CliRunner  # noqa: E402

from sentinel.cli import app  # noqa: E402
from sentinel.dashboards import build, panel_queries, render  # noqa: E402
from sentinel.rules.config import load_pack  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
UIDS = {"overview": "sentinel-overview", "layers": "sentinel-layers",
        "optimizer-memory": "sentinel-optimizer-memory", "ranks-gpus": "sentinel-ranks-gpus"}


def test_committed_json_is_what_the_generator_writes(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dashboards", "generate", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = {p.name: p.read_bytes() for p in tmp_path.glob("*.json")}
    committed = {p.name: p.read_bytes() for p in (ROOT / "dashboards").glob("*.json")}
    assert written == committed, "run `sentinel dashboards generate` and commit dashboards/"


def test_uids_are_stable_and_panels_unique() -> None:
    docs = build()
    assert {stem: d["uid"] for stem, d in docs.items()} == UIDS
    for d in docs.values():
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids))


@pytest.mark.parametrize("stem", sorted(UIDS))
def test_variables_are_multi_select_with_all(stem: str) -> None:
    variables = {v["name"]: v for v in build()[stem]["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "run", "rank", "group"]
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "run", "rank", "group"):
        v = variables[name]
        assert v["multi"] and v["includeAll"] and v["allValue"] == ".*"


@pytest.mark.parametrize("stem", sorted(UIDS))
def test_every_query_is_scoped_by_the_variables(stem: str) -> None:
    for title, expr in panel_queries(build()[stem]):
        if expr.startswith(("sentinel_gpu", "increase(sentinel_gpu", "DCGM")):
            continue  # node-level GPU series: no job/run/rank
        assert 'run=~"$run"' in expr, (title, expr)


def test_alerts_are_annotations_from_sentinel_alert_firing() -> None:
    for d in build().values():
        anns = {a["name"]: a for a in d["annotations"]["list"]}
        assert "sentinel_alert_firing" in anns["Sentinel alerts"]["expr"]
        assert anns["Sentinel alerts"]["tagKeys"] == "alertname,severity,run"
        assert anns["Sentinel events"]["target"]["tags"] == ["sentinel"]


def _panel(doc: dict, title: str) -> dict:  # type: ignore[type-arg]
    [p] = [p for p in doc["panels"] if p.get("title") == title]
    return p


@pytest.mark.parametrize(("stem", "title", "rules"), [
    ("overview", "Update ratio (UAR and L2)", {"UpdateRatioLow": 1e-4, "UpdateRatioHigh": 0.1}),
    ("overview", "Gradient norm (pre- and post-clip)", {"GradientExplosion": 1000.0}),
    ("ranks-gpus", "GPU temperature", {"GPUOverheating": 85.0}),
    ("ranks-gpus", "Straggler: busy time / other ranks'", {"RankStraggler": 1.5}),
])
def test_threshold_lines_come_from_the_rule_pack(stem: str, title: str, rules: dict[str, float]) -> None:
    def lines(pack_overrides: dict[str, float]) -> list[float]:
        pack = load_pack({"rules": {n: {"params": {"value": v}} for n, v in pack_overrides.items()}})
        steps = _panel(build(pack)[stem], title)["fieldConfig"]["defaults"]["thresholds"]["steps"]
        return [s["value"] for s in steps if s["value"] is not None]

    assert lines({}) == sorted(rules.values())
    doubled = {n: v * 2 for n, v in rules.items()}
    assert lines(doubled) == sorted(doubled.values())  # a user's pack moves the lines


def test_units_are_the_catalogs_base_units() -> None:
    doc = build()["optimizer-memory"]
    assert _panel(doc, "State bytes by key vs parameter bytes")["fieldConfig"]["defaults"]["unit"] == "bytes"
    assert _panel(build()["ranks-gpus"], "Step time per rank")["fieldConfig"]["defaults"]["unit"] == "s"


def test_layers_has_heatmaps_and_top_k() -> None:
    types = [(p["type"], p.get("title", "")) for p in build()["layers"]["panels"]]
    assert sum(t == "heatmap" for t, _ in types) == 3
    assert any("top 5" in title for _, title in types)


def test_render_is_deterministic() -> None:
    assert render() == render()
    assert all(json.loads(text) for text in render().values())
