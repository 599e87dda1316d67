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


def test_generate_with_a_config_draws_its_thresholds(tmp_path: Path) -> None:
    """`sentinel dashboards generate --config FILE`: the user's rule thresholds are the lines."""
    cfg = tmp_path / "sentinel.yaml"
    cfg.write_text("rules:\n  GradientExplosion:\n    params: {value: 250.0}\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["dashboards", "generate", "--out", str(out), "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "overview.json").read_text())
    steps = _panel(doc, "Gradient norm (pre- and post-clip)")["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps if s["value"] is not None] == [250.0]

    cfg.write_text("rules:\n  GradientExplosion:\n    params: {value: high}\n")  # not a number
    result = CliRunner().invoke(app, ["dashboards", "generate", "--out", str(tmp_path / "bad"), "--config", str(cfg)])
    assert result.exit_code == 2 and "GradientExplosion" in result.output
    assert not (tmp_path / "bad").exists()


def test_the_file_provisioning_matches_the_dashboards_and_the_provision_command() -> None:
    """dashboards/provisioning/: the datasource it makes is the one the dashboards open on
    and `sentinel dashboards provision` makes; the dashboards land in provision's folder.
    No Grafana server runs here: the shapes are checked against Grafana's documented ones."""
    import yaml

    from sentinel.dashboards.provision import DATASOURCE_NAME, DATASOURCE_UID, FOLDER_UID

    sources = yaml.safe_load((ROOT / "dashboards/provisioning/datasources.yaml").read_text())
    assert sources["apiVersion"] == 1
    [ds] = sources["datasources"]
    assert (ds["uid"], ds["name"], ds["type"], ds["access"]) == (DATASOURCE_UID, DATASOURCE_NAME, "prometheus", "proxy")
    providers = yaml.safe_load((ROOT / "dashboards/provisioning/dashboards.yaml").read_text())
    assert providers["apiVersion"] == 1
    [prov] = providers["providers"]
    assert prov["type"] == "file" and prov["folderUid"] == FOLDER_UID and prov["options"]["path"].startswith("/")
    for path in (ROOT / "dashboards").glob("*.json"):
        doc = json.loads(path.read_text())
        [var] = [v for v in doc["templating"]["list"] if v["type"] == "datasource"]
        assert var["query"] == "prometheus" and var["current"]["value"] == DATASOURCE_UID, path.name
        refs = {json.dumps(p.get("datasource")) for p in doc["panels"] if "datasource" in p}
        assert refs <= {json.dumps({"type": "prometheus", "uid": "${datasource}"})}, (path.name, refs)
