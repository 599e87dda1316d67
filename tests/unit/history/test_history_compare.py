"""The comparison table's pure parts: diverged, mean ± std, the seed grouping, the optimizer column."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sentinel import wire
from sentinel.history.compare import diverged, group_key, mean_std
from sentinel.history.query import RunInfo
from sentinel.history.values import optimizer_label, optimizer_of
from sentinel.instrument import optinfo


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


def test_a_frames_optimizer_field_is_read_as_the_instrument_wrote_it() -> None:
    """What the instrument describes, through the wire's strict decode, is what the history
    keeps: one type on both sides (its key once spelt two ways kept every run's optimizer out)."""
    model = torch.nn.Linear(4, 2)
    opts = [torch.optim.AdamW(model.parameters(), lr=1e-3), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)]
    frame = wire.Frame(kind="step", job="j", run="r", rank=0, step=1, t=1.0, optim=optinfo.describe(opts))
    got = optimizer_of(wire.decode(wire.encode(frame))["optim"])
    assert got == [{"class": "AdamW", "dtype": "float32", "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                    "weight_decay": 0.01, "decoupled": 1.0},
                   {"class": "SGD", "dtype": "float32", "lr": 0.1, "weight_decay": 0.0, "momentum": 0.9}]
    assert optimizer_label(got, None) == "AdamW+SGD"


@pytest.mark.parametrize("field", [
    {"class": "AdamW", "hp": {"lr": 1e-3}},  # one record, not a list of them
    [{"name": "Lion", "hp": {"lr": 1e-4}}],  # no "class"
    [{"class": "", "hp": {}}],
    [{"class": "SGD", "hp": {"lr": "fast"}}],
    [],
    "AdamW",
])
def test_an_optimizer_field_of_another_shape_is_none(field: Any) -> None:
    assert optimizer_of(field) is None
