"""docs/instrumenting.md: every option of ``sentinel.watch`` can come from ``SENTINEL_<NAME>``,
explicit arguments win, and bad options raise at once (before anything is hooked)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import sentinel
from sentinel.instrument import registry
from sentinel.instrument.options import from_kwargs
from tests.helpers import MLP


@pytest.mark.parametrize(("env", "kwargs", "name", "expected"), [
    ({"SENTINEL_UPDATE_EVERY": "20"}, {}, "update_every", 20),
    ({"SENTINEL_UPDATE_EVERY": "20"}, {"update_every": 5}, "update_every", 5),  # the argument wins
    ({}, {}, "update_every", 100),
    ({"SENTINEL_RUN": "from-env"}, {}, "run", "from-env"),
    ({"SENTINEL_RUN": "from-env"}, {"run": "exp-42"}, "run", "exp-42"),
    ({"SENTINEL_CAPTURE_LOSS": "true"}, {}, "capture_loss", True),
    ({"SENTINEL_CAPTURE_LOSS": "true"}, {"capture_loss": False}, "capture_loss", False),
    ({"SENTINEL_LISTEN": "127.0.0.1:9555"}, {}, "listen", "127.0.0.1:9555"),
])
def test_sentinel_variables_fill_what_no_argument_gives(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                       kwargs: dict[str, Any], name: str, expected: Any) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert getattr(from_kwargs(kwargs), name) == expected


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"update_evry": 5}, TypeError),  # a misspelt option
    ({"update_every": 0}, ValueError),
    ({"engine": "gpu"}, ValueError),
])
def test_a_bad_option_raises_at_once_and_hooks_nothing(kwargs: dict[str, Any], error: type[Exception]) -> None:
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(error):
        sentinel.watch(model, opt, **kwargs)
    assert registry.monitor_of(opt) is None  # no monitor follows its steps
    good = sentinel.watch(model, opt, engine="off")  # the check of the test itself: a good call does
    try:
        assert registry.monitor_of(opt) is good
    finally:
        good.close()
