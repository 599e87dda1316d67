"""The step guard's rules as Prometheus alerting rules (``sentinel rules export --format
prometheus``): exported from the series the engine writes, with the pack's thresholds; the
engine writes those series from the first judged step on. promtool's own unit tests of
the exported rules (alerts/tests/sentinel.rules.test.yml) run in test_promexport.py."""

from __future__ import annotations

import pytest
import torch
import yaml

from sentinel.catalog import CATALOG
from sentinel.rules.config import load_pack
from sentinel.rules.promexport import export_prometheus
from sentinel.store import labels_of
from tests.helpers import MLP, make_monitor

GUARD_RULES = ("StepSkipped", "StepsSkippedRepeatedly", "GuardExhausted")


def _rules(overrides: dict | None = None) -> dict[str, dict]:
    pack = load_pack({"rules": overrides or {}})
    return {r["alert"]: r for r in yaml.safe_load(export_prometheus(pack))["groups"][0]["rules"]}


def test_the_guard_rules_export_with_their_severity_and_words() -> None:
    rules = _rules()
    pack = {r.name: r for r in load_pack().enabled()}
    for name in GUARD_RULES:
        assert rules[name]["labels"]["severity"] == pack[name].severity
        assert rules[name]["annotations"]["causes"] == "; ".join(pack[name].causes)
    assert rules["StepSkipped"]["expr"] == "increase(sentinel_guard_skipped_total[5m]) > 0"
    assert rules["StepsSkippedRepeatedly"]["expr"].startswith("sentinel_guard_skip_run_length >= 3 and on ")
    assert rules["GuardExhausted"]["expr"] == "increase(sentinel_guard_exhausted_total[5m]) > 0"


@pytest.mark.parametrize(("overrides", "name", "expr_start"), [
    ({"StepsSkippedRepeatedly": {"params": {"min_consecutive": 5}}}, "StepsSkippedRepeatedly",
     "sentinel_guard_skip_run_length >= 5 and on "),
    ({"StepSkipped": {"params": {"min_consecutive": 2}}}, "StepSkipped", "sentinel_guard_skip_run_length >= 2 and on "),
    ({"GuardExhausted": {"enabled": False}}, "GuardExhausted", None),
])
def test_guard_rule_overrides_export(overrides: dict, name: str, expr_start: str | None) -> None:
    rules = _rules(overrides)
    if expr_start is None:
        assert name not in rules
    else:
        assert rules[name]["expr"].startswith(expr_start)


def test_every_series_the_exported_guard_rules_read_is_in_the_catalog() -> None:
    rules = _rules()
    for name in GUARD_RULES:
        used = [m for m in CATALOG if m.startswith("sentinel_guard") and m in rules[name]["expr"]]
        assert used, name
    assert CATALOG["sentinel_guard_exhausted_total"].kind == "counter"
    assert CATALOG["sentinel_guard_skip_run_length"].kind == "gauge"


def test_the_engine_writes_them_from_the_first_step_and_keeps_the_runs_length() -> None:
    """At 0 from the first judged step (a Prometheus increase() then sees the first skip);
    the latest run's length stays after the run; the exhausted counter counts outcomes."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt, guard={"warmup": 3, "max_consecutive": 2, "on_exhausted": "through"},
                               job="j", run="r")
    store = sender.engine.store
    base = labels_of(job="j", run="r", rank=0)
    seen = []
    gen = torch.Generator().manual_seed(0)
    for step in range(1, 13):
        x = torch.randn(8, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        if step in (3, 6, 7, 10, 11, 12):  # NaNs: 3 alone, 6-7, then 10-12 (12: past max_consecutive)
            model.head.weight.grad[0, 0] = float("nan")
        opt.step()
        mon.log(loss=loss)
        run = store.last("sentinel_guard_skip_run_length", base)
        seen.append((None if run is None else run[2],
                     store.counter("sentinel_guard_skipped_total", labels_of(job="j", run="r", rank=0,
                                                                             reason="nonfinite")),
                     store.counter("sentinel_guard_exhausted_total", base)))
    mon.close()
    assert seen[0] == (0.0, 0.0, 0.0)  # every series exists from the first step, at 0
    assert mon.guard.steps == [3, 6, 7, 10, 11] and mon.guard.through == 1
    assert [s[0] for s in seen] == [0, 0, 1, 1, 1, 1, 2, 2, 2, 1, 2, 2]
    assert seen[-1][1:] == (5.0, 1.0)
