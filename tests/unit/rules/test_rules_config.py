"""Rule-pack loading: the shipped default, user overrides, extra rules, and error lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sentinel.rules import DETECTORS, ConfigError, Rule, load_pack
from sentinel.rules.config import parse_rule
from sentinel.rules.spike import SpikeParams
from sentinel.rules.threshold import ThresholdParams

REPO = Path(__file__).resolve().parents[3]

BUILTIN = [
    "TrainingNonFinite",
    # the first steps of a run (issue 13)
    "EarlyLossSwing", "EarlyUpdateTooLarge", "EarlyGradientGrowth", "EarlyLossRising",
    "EarlyLossExplosion",  # issue 20
    "EarlyLossStalled",
    "LossSpike", "LossDivergence",
    "LossRising",  # issue 20
    "LossOscillation",
    "TrainingCollapsed",  # a network that answers every input alike: loss flat, spread and gradients collapsed (Dec 2026)
    "LossPlateau",
    "GradientSpike",
    # the step guard's (issue 21), judged only where actions.guard is on
    "StepSkipped", "StepsSkippedRepeatedly", "GuardExhausted",
    "GradientExplosion", "GradientVanishing",
    "GradientsMissing",  # an optimizer that no gradient reaches (public-shape review, Dec 2026)
    "GradientsNotReset",  # a loop with no zero_grad(): each step applies every gradient so far (Dec 2026)
    "GradientNoiseHigh",
    "GradientNoiseRising", "UpdateRatioHigh", "UpdateRatioLow", "UpdateNormLow",
    "LearningRateVanished",  # a schedule that stopped the training (public-shape review, Dec 2026)
    "OptimizerStateSaturated", "OOMRisk",
    "MemoryCritical", "CudaOOM", "CudaAllocRetries",
    "OptimizerEpsTooSmallFp16", "OptimizerBeta2TooLong", "OptimizerBeta1Low", "AdamWWithoutWeightDecay",
    "SGDWithoutClipping", "LossScaleCollapse", "TrainingStalled",
    # the daemon issue's: liveness, cross-rank and GPU health
    "TrainingCrashed", "RankDivergence", "RankStraggler", "GPUOverheating", "GPUXidError", "GPUEccErrors",
]  # fmt: skip

EXTRA: dict[str, Any] = {
    "name": "StepTimeHigh",
    "kind": "threshold",
    "metric": "sentinel_step_duration_seconds",
    "severity": "info",
    "params": {"op": ">", "value": 5.0},
    "summary": "Step time {value:.1f} s on {ranks}",
}


def test_default_pack_copies_are_identical() -> None:
    shipped = (REPO / "sentinel" / "rules" / "default.yaml").read_bytes()
    exported = (REPO / "alerts" / "default-rules.yaml").read_bytes()
    assert shipped == exported, "copy sentinel/rules/default.yaml to alerts/default-rules.yaml"


def test_default_pack_names_are_the_contract() -> None:
    assert load_pack().names() == BUILTIN


def test_every_builtin_rule_explains_itself() -> None:
    for r in load_pack().rules:
        assert r.kind in DETECTORS
        assert r.causes and r.checks and r.runbook and r.summary, r.name
        assert r.severity in ("info", "warning", "critical")


def test_nonfinite_is_critical_and_immediate() -> None:
    r = load_pack().get("TrainingNonFinite")
    assert r.severity == "critical" and r.for_steps <= 1


@pytest.mark.parametrize("user", [None, {}, {"rules": {}, "extra_rules": []}, {"other": 1}])
def test_empty_user_config_gives_defaults(user: Any) -> None:
    assert load_pack(user).names() == BUILTIN


@pytest.mark.parametrize(
    ("user", "rule", "check"),
    [
        ({"rules": {"LossSpike": {"enabled": False}}}, "LossSpike", lambda r: not r.enabled),
        (
            {"rules": {"GradientSpike": {"params": {"factor": 20}}}},
            "GradientSpike",
            # params merge key by key: the other defaults stay
            lambda r: isinstance(r.params, SpikeParams)
            and r.params.factor == 20
            and r.params.window == 100,
        ),
        (
            {"rules": {"UpdateRatioHigh": {"params": {"value": 0.05}, "severity": "critical"}}},
            "UpdateRatioHigh",
            lambda r: r.params.value == 0.05 and r.severity == "critical",
        ),
        (
            {"rules": {"TrainingStalled": {"params": {"min_seconds": 30}, "for_steps": 2}}},
            "TrainingStalled",
            lambda r: r.params.min_seconds == 30 and r.for_steps == 2,
        ),
        (
            # changing the kind replaces params instead of merging them
            {"rules": {"LossSpike": {"kind": "threshold", "params": {"value": 10.0}}}},
            "LossSpike",
            lambda r: isinstance(r.params, ThresholdParams) and r.params.value == 10.0,
        ),
    ],
)
def test_overrides(user: dict[str, Any], rule: str, check: Any) -> None:
    pack = load_pack(user)
    assert check(pack.get(rule))
    assert pack.names() == BUILTIN


def test_disabled_rule_is_not_enabled() -> None:
    pack = load_pack({"rules": {"LossPlateau": {"enabled": False}}})
    assert "LossPlateau" not in [r.name for r in pack.enabled()]


def test_extra_rule_is_appended() -> None:
    pack = load_pack({"extra_rules": [EXTRA]})
    assert pack.names() == [*BUILTIN, "StepTimeHigh"]
    assert pack.get("StepTimeHigh").params == ThresholdParams(op=">", value=5.0)


def test_overrides_do_not_leak_between_loads() -> None:
    load_pack({"rules": {"GradientSpike": {"params": {"factor": 99}}}})
    assert load_pack().get("GradientSpike").params.factor == 3.0  # type: ignore[attr-defined]


def _ov(**fields: Any) -> dict[str, Any]:
    """An override of LossSpike."""
    return {"rules": {"LossSpike": fields}}


def _extra(**fields: Any) -> dict[str, Any]:
    """One extra rule: EXTRA with ``fields`` changed (None removes a field)."""
    rule = {k: v for k, v in {**EXTRA, **fields}.items() if v is not None}
    return {"extra_rules": [rule]}


@pytest.mark.parametrize(
    ("user", "line"),
    [
        (
            {"rules": {"LossSpike": {"params": {"factor": "big"}}}},
            "rules.LossSpike.params.factor: Input should be a valid number",
        ),
        (
            {"rules": {"LossSpike": {"params": {"factr": 3}}}},
            "rules.LossSpike.params.factr: Extra inputs are not permitted (did you mean 'factor'?)",
        ),
        (
            {"rules": {"LossSpike": {"params": {"factor": 0.5}}}},
            "rules.LossSpike.params.factor: Input should be greater than 1",
        ),
        (_ov(for_steps=-1), "rules.LossSpike.for_steps: Input should be"),
        (_ov(severity="page"), "rules.LossSpike.severity: Input should be"),
        (_ov(colour="red"), "rules.LossSpike.colour: Extra inputs are not permitted"),  # nothing close
        (_ov(severty="warning"), "rules.LossSpike.severty: Extra inputs are not permitted (did you mean 'severity'?)"),
        ({"rules": {"LosSpike": {"enabled": False}}}, "rules.LosSpike: unknown rule (did you mean 'LossSpike'?); the built-in rules"),
        ({"rules": {"Nope": {}}}, "rules.Nope: unknown rule; the built-in rules are TrainingNonFinite, "),
        ({"rules": {"LossSpike": False}}, "rules.LossSpike: Input should be a valid dictionary"),
        ({"rules": ["LossSpike"]}, "rules: Input should be a valid dictionary"),
        (_ov(summary="{nope}"), "rules.LossSpike.summary: unknown field {nope}"),
        (_ov(summary="{value:zz}"), "rules.LossSpike.summary: bad template"),
        (_ov(kind="magic"), "rules.LossSpike.kind: unknown detector kind 'magic'"),
        (_ov(name="Other"), "rules.LossSpike.name: a built-in rule cannot be renamed"),
        (_extra(params={}), "extra_rules.0.params.value: Field required"),
        (_extra(name="LossSpike"), "extra_rules.0.name: duplicate rule name"),
        ({"extra_rules": [EXTRA, EXTRA]}, "extra_rules.1.name: duplicate rule name"),
        (_extra(metric=None), "extra_rules.0.metric: Field required"),
        (_extra(name="bad name"), "extra_rules.0.name: String should match pattern"),
        ({"extra_rules": {"x": 1}}, "extra_rules: Input should be a valid list"),
    ],
)
def test_errors_name_the_dotted_key(user: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_pack(user)
    lines = str(info.value).splitlines()
    assert any(ln.startswith(line) for ln in lines), lines
    assert info.value.problems == lines


def test_every_problem_is_reported_at_once() -> None:
    user = {
        "rules": {
            "LossSpike": {"params": {"factor": "x"}, "for_steps": "y"},
            "Nope": {},
        },
        "extra_rules": [{**EXTRA, "params": {"value": "z"}}],
    }
    with pytest.raises(ConfigError) as info:
        load_pack(user)
    keys = sorted(ln.split(":")[0] for ln in info.value.problems)
    assert keys == [
        "extra_rules.0.params.value",
        "rules.LossSpike.for_steps",
        "rules.LossSpike.params.factor",
        "rules.Nope",
    ]


def test_unknown_rule_error_lists_the_builtins() -> None:
    with pytest.raises(ConfigError, match="built-in rules are TrainingNonFinite, EarlyLossSwing"):
        load_pack({"rules": {"Unknown": {}}})


def test_parse_rule_and_metric_list() -> None:
    rule, problems = parse_rule({**EXTRA, "metric": ["a", "b"]}, ("x",))
    assert problems == [] and isinstance(rule, Rule)
    assert rule.metrics == ("a", "b")
    _, problems = parse_rule({**EXTRA, "metric": []}, ("x",))
    assert problems == ["x.metric: at least one metric is required"]
    _, problems = parse_rule("nope", ("x", 0))
    assert problems == ["x.0: Input should be a valid dictionary"]
