"""``sentinel demo``'s faults, run in-process: each shows a matching alert, ``none`` none."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from sentinel.demo.run import EXPECTED_ALERTS, FAULTS, DemoConfig, run_demo

# lr-low needs its 100 steps of lr grace plus 10 low update-ratio samples after the fault
# (at 40 % of the run); the others are seen well within 300 steps
STEPS = {"lr-low": 400}


def test_every_fault_has_an_expectation() -> None:
    assert set(EXPECTED_ALERTS) == set(FAULTS)


@pytest.mark.parametrize("fault", FAULTS)
def test_demo_fault_shows_its_alert(fault: str, capfd: pytest.CaptureFixture[str]) -> None:
    cfg = DemoConfig(fault=fault, steps=STEPS.get(fault, 300), delay=0, listen="127.0.0.1:0",
                     hang_seconds=4.0)
    out = io.StringIO()
    summary = run_demo(cfg, console=Console(file=out, width=160))
    assert summary["errors"] == 0
    expected = EXPECTED_ALERTS[fault]
    if expected:
        assert set(expected) & set(summary["alerts"]), (fault, summary["alerts"])
    else:
        assert summary["alerts"] == [], summary["alerts"]
    assert "sentinel demo" in out.getvalue()
    # the live view draws the alerts: the engine keeps the terminal quiet (notify.console: false)
    assert "sentinel: [" not in capfd.readouterr().err
