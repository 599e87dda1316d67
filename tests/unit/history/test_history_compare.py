"""The comparison table's pure parts: diverged, mean ± std, the seed grouping."""

from __future__ import annotations

from typing import Any

import pytest

from sentinel.history.compare import diverged, group_key, mean_std
from sentinel.history.query import RunInfo
from sentinel.history.values import optimizer_of


def info(**kw: Any) -> RunInfo:
    base: dict[str, Any] = dict(id=1, job="j", run="r", host=None, command=None, ranks=1, started=0.0, ended=1.0,
                                last_seen=1.0, exit_status=None, state="finished", optimizer=None, tags={},
                                groups=[], env=None, steps=10, first_loss=2.0, final_loss=1.0, min_loss=1.0,
                                nonfinite=False, mean_grad_norm=1.0, mean_delta_norm=None, peak_memory=None,
                                stride=1)
    return RunInfo(**{**base, **kw})


@pytest.mark.parametrize(("kw", "div"), [
    ({}, False),
    ({"final_loss": 2.5}, True),  # above its start
    ({"nonfinite": True}, True),
    ({"final_loss": None}, False),
])
def test_diverged(kw: dict[str, Any], div: bool) -> None:
    assert diverged(info(**kw)) is div


@pytest.mark.parametrize(("xs", "text"), [
    ([], "—"), ([1.5], "1.5"), ([1.0, 3.0], "2 ± 1.414"), ([1.0, float("nan")], "1 (1 non-finite)"),
])
def test_mean_std(xs: list[float], text: str) -> None:
    assert mean_std(xs) == text


def test_runs_differing_only_by_seed_share_a_row() -> None:
    a = info(tags={"optimizer": "lion", "lr": "3e-4", "seed": "1"})
    b = info(run="r2", tags={"optimizer": "lion", "lr": "3e-4", "seed": "2"})
    c = info(run="r3", tags={"optimizer": "lion", "lr": "1e-3", "seed": "1"})
    assert group_key(a, None) == group_key(b, None) != group_key(c, None)
    assert group_key(a, "optimizer") == group_key(c, "optimizer")
    assert group_key(info(), None) != group_key(info(run="other"), None)  # untagged runs stand alone


@pytest.mark.parametrize(("field", "out"), [
    ({"class": "AdamW", "lr": 1e-3, "betas": [0.9, 0.999], "foreach": None}, [{"class": "AdamW", "lr": 1e-3,
                                                                              "betas": [0.9, 0.999]}]),
    ([{"name": "Lion", "lr": 1e-4}, {"class": "SGD", "momentum": 0.9}], [{"class": "Lion", "lr": 1e-4},
                                                                       {"class": "SGD", "momentum": 0.9}]),
    ({"lr": 1e-3}, None),
    ("AdamW", None),
])
def test_a_frames_optimizer_field(field: Any, out: Any) -> None:
    assert optimizer_of(field) == out
