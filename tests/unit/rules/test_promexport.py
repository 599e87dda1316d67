"""The exported Prometheus rules: committed, regenerated identically, valid for promtool,
and their promtool unit tests pass; a user's threshold override exports too."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sentinel.rules.config import load_pack
from sentinel.rules.promexport import export_prometheus, promtool_tests

ALERTS = Path(__file__).resolve().parents[3] / "alerts"


def test_committed_rules_and_their_tests_match_a_fresh_export() -> None:
    pack = load_pack()
    assert (ALERTS / "sentinel.rules.yml").read_text("utf-8") == export_prometheus(pack), \
        "regenerate: sentinel rules export --format prometheus -o alerts/sentinel.rules.yml"
    assert (ALERTS / "tests" / "sentinel.rules.test.yml").read_text("utf-8") == promtool_tests(pack)


def test_overrides_export_and_disabled_rules_do_not() -> None:
    pack = load_pack({"rules": {"UpdateRatioHigh": {"params": {"value": 0.3}}, "GPUOverheating": {"enabled": False}}})
    rules = {r["alert"]: r for r in yaml.safe_load(export_prometheus(pack))["groups"][0]["rules"]}
    assert rules["UpdateRatioHigh"]["expr"] == "(sentinel_update_mean_abs_ratio or sentinel_update_ratio) > 0.3"
    assert "GPUOverheating" not in rules
    assert {"TrainingNonFinite", "TrainingStalled", "OOMRisk", "UpdateRatioLow", "GPUXidError", "GPUEccErrors",
            "GradientsMissing", "GradientsNotReset", "LearningRateVanished", "SentinelExporterDown",
            "SentinelDaemonDown", "SentinelAlertFiring"} <= set(rules)
    assert "sentinel_nonfinite_total" in rules["TrainingNonFinite"]["expr"]  # the counter: a NaN between scrapes


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_promtool_checks_and_tests_the_committed_rules() -> None:
    check = subprocess.run(["promtool", "check", "rules", "sentinel.rules.yml"], cwd=ALERTS, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 18 rules found" in check.stdout
    test = subprocess.run(["promtool", "test", "rules", "sentinel.rules.test.yml"], cwd=ALERTS / "tests",
                          capture_output=True, text=True, timeout=60)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout


def test_the_memory_forecast_exports_with_the_packs_horizon() -> None:
    # OOMRisk forecasts at any use (issue 20): PromQL extrapolates the base of the memory
    # used (its 10-minute minimum, which a short sawtooth returns to) over the horizon
    pack = load_pack({"rules": {"OOMRisk": {"params": {"horizon_seconds": 600}}}})
    rules = {r["alert"]: r for r in yaml.safe_load(export_prometheus(pack))["groups"][0]["rules"]}
    expr = rules["OOMRisk"]["expr"]
    assert expr.startswith("sentinel_memory_used_bytes / sentinel_memory_capacity_bytes > 0.8 or ")
    assert "predict_linear(min_over_time(sentinel_memory_used_bytes[10m])[30m:1m], 600)" in expr
    off = load_pack({"rules": {"OOMRisk": {"params": {"min_ratio": 1.0}}}})
    rules = {r["alert"]: r for r in yaml.safe_load(export_prometheus(off))["groups"][0]["rules"]}
    assert "predict_linear" not in rules["OOMRisk"]["expr"]
